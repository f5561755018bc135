/* What a TLS connection's session says, in the environ's names (nginx's
 * and Apache's: HTTPS, SSL_PROTOCOL, SSL_CIPHER, SSL_CLIENT_*): the
 * connection layer reads the session (conn_tls_info.c: tls_facts,
 * tls_peer), this file only names what it read.
 *
 * May call: the connection layer's TLS step (conn_tls.h).
 */
#include <string.h>

#include "wsgi.h"
#include "conn_tls.h"

PyObject *wsgi_tls_environ(struct conn *c)
{
	struct tls_facts f;
	struct tls_peer peer;
	PyObject *d;
	int rc, has;

	if (c->tls_env)
		return c->tls_env;
	if ((has = tls_peer(c, &peer)) < 0)
		return NULL;
	if (!(d = PyDict_New())) {
		tls_peer_clear(&peer);
		return NULL;
	}
	tls_facts(c, &f);
	rc = dict_put(d, "HTTPS", PyUnicode_FromString("on")) < 0 ||
	     dict_put(d, "wsgi.url_scheme", PyUnicode_FromString("https")) < 0 ||
	     dict_put(d, "SSL_PROTOCOL", PyUnicode_FromString(f.protocol)) < 0 ||
	     dict_put(d, "SSL_CIPHER", PyUnicode_FromString(f.cipher)) < 0 ||
	     dict_put(d, "SSL_SESSION_RESUMED",
	              PyUnicode_FromString(f.resumed ? "Resumed" : "Initial")) < 0 ||
	     dict_put(d, "SSL_CLIENT_VERIFY", tls_verify_text(c, has)) < 0;
	/* the SNI as the client sent it, any bytes (OpenSSL checks only that
	 * it has no NUL): latin-1, PEP 3333's decoding of the environ's
	 * strings, which no byte fails (UTF-8 failed on a name that is not,
	 * and every request of the connection with it: issue 35 §19) */
	if (!rc && f.sni)
		rc = dict_put(d, "SSL_TLS_SNI",
		              PyUnicode_DecodeLatin1(f.sni, (Py_ssize_t)strlen(f.sni), NULL)) < 0;
	/* dict_put takes each reference */
	if (!rc && has)
		rc = dict_put(d, "SSL_CLIENT_S_DN", Py_NewRef(peer.subject)) < 0 ||
		     dict_put(d, "SSL_CLIENT_I_DN", Py_NewRef(peer.issuer)) < 0 ||
		     dict_put(d, "SSL_CLIENT_M_SERIAL", Py_NewRef(peer.serial)) < 0 ||
		     dict_put(d, "SSL_CLIENT_CERT", Py_NewRef(peer.pem)) < 0;
	tls_peer_clear(&peer);
	if (rc) {
		Py_DECREF(d);
		return NULL;
	}
	c->tls_env = d;
	return d;
}
