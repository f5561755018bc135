/* What a connection's TLS session tells the app (the connection layer's
 * TLS step, conn_tls.c, holds the session): the WSGI environ's keys
 * (nginx's and Apache's names) and the ASGI "tls" extension's dict, and
 * a certificate as PEM for the context's server_cert (conn_tls_ctx.c).
 * OpenSSL's error queue is left empty after every call here.
 */
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "server.h"
#include "conn_tls.h"
#include "conn_tls_int.h"

/* ---- what the session tells the app --------------------------------------------------------- */

/* What a memory BIO holds once fill wrote to it, as str. */
static PyObject *bio_text(int (*fill)(BIO *, void *), void *what)
{
	BIO *b = BIO_new(BIO_s_mem());
	char *p;
	long n;
	PyObject *v;

	if (!b)
		return PyErr_NoMemory();
	fill(b, what);
	n = BIO_get_mem_data(b, &p);
	v = PyUnicode_DecodeUTF8(p, n, "replace");
	BIO_free(b);
	return v;
}

static int fill_name(BIO *b, void *name)
{
	return X509_NAME_print_ex(b, name, 0, XN_FLAG_RFC2253);
}

static int fill_pem(BIO *b, void *x)
{
	return PEM_write_bio_X509(b, x);
}

/* a name as RFC 2253 text (nginx's $ssl_client_s_dn); a certificate in PEM */
static PyObject *name_str(X509_NAME *name) { return bio_text(fill_name, name); }
PyObject *pem_str(X509 *x) { return bio_text(fill_pem, x); }

static PyObject *serial_str(X509 *x)
{
	BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
	char *hex = bn ? BN_bn2hex(bn) : NULL;
	PyObject *v = hex ? PyUnicode_FromString(hex) : PyErr_NoMemory();

	OPENSSL_free(hex);
	BN_free(bn);
	return v;
}

/* SUCCESS, NONE (no certificate), or FAILED:reason (nginx's values) */
static PyObject *verify_str(SSL *ssl, X509 *peer)
{
	long rc = SSL_get_verify_result(ssl);

	if (!peer)
		return PyUnicode_FromString("NONE");
	if (rc == X509_V_OK)
		return PyUnicode_FromString("SUCCESS");
	return PyUnicode_FromFormat("FAILED:%s", X509_verify_cert_error_string(rc));
}

PyObject *tls_environ(struct conn *c)
{
	const char *sni;
	PyObject *d;
	X509 *peer;
	int rc;

	if (c->tls_env)
		return c->tls_env;
	if (!(d = PyDict_New()))
		return NULL;
	peer = SSL_get1_peer_certificate(c->ssl);
	rc = dict_put(d, "HTTPS", PyUnicode_FromString("on")) < 0 ||
	     dict_put(d, "wsgi.url_scheme", PyUnicode_FromString("https")) < 0 ||
	     dict_put(d, "SSL_PROTOCOL", PyUnicode_FromString(SSL_get_version(c->ssl))) < 0 ||
	     dict_put(d, "SSL_CIPHER", PyUnicode_FromString(SSL_get_cipher_name(c->ssl))) < 0 ||
	     dict_put(d, "SSL_SESSION_RESUMED",
	         PyUnicode_FromString(SSL_session_reused(c->ssl) ? "Resumed" : "Initial")) < 0 ||
	     dict_put(d, "SSL_CLIENT_VERIFY", verify_str(c->ssl, peer)) < 0;
	/* the SNI as the client sent it, any bytes (OpenSSL checks only that
	 * it has no NUL): latin-1, PEP 3333's decoding of the environ's
	 * strings, which no byte fails (UTF-8 failed on a name that is not,
	 * and every request of the connection with it: issue 35 §19) */
	sni = SSL_get_servername(c->ssl, TLSEXT_NAMETYPE_host_name);
	if (!rc && sni)
		rc = dict_put(d, "SSL_TLS_SNI",
		              PyUnicode_DecodeLatin1(sni, (Py_ssize_t)strlen(sni), NULL)) < 0;
	if (!rc && peer)
		rc = dict_put(d, "SSL_CLIENT_S_DN", name_str(X509_get_subject_name(peer))) < 0 ||
		     dict_put(d, "SSL_CLIENT_I_DN", name_str(X509_get_issuer_name(peer))) < 0 ||
		     dict_put(d, "SSL_CLIENT_M_SERIAL", serial_str(peer)) < 0 ||
		     dict_put(d, "SSL_CLIENT_CERT", pem_str(peer)) < 0;
	X509_free(peer);
	ERR_clear_error();
	if (rc) {
		Py_DECREF(d);
		return NULL;
	}
	c->tls_env = d;
	return d;
}

PyObject *tls_scope(struct conn *c)
{
	STACK_OF(X509) *chain = SSL_get_peer_cert_chain(c->ssl);
	X509 *peer = SSL_get1_peer_certificate(c->ssl);
	PyObject *d = PyDict_New(), *list = PyList_New(0);
	long vr = SSL_get_verify_result(c->ssl);
	int rc = !d || !list;

	/* the client's certificate first, then its chain (a server's chain
	 * leaves the peer's own out of SSL_get_peer_cert_chain) */
	if (!rc && peer)
		rc = dict_put(d, "client_cert_name", name_str(X509_get_subject_name(peer))) < 0;
	if (!rc && peer) {
		PyObject *v = pem_str(peer);

		rc = !v || PyList_Append(list, v) < 0;
		Py_XDECREF(v);
		for (int i = 0; !rc && chain && i < sk_X509_num(chain); i++) {
			X509 *x = sk_X509_value(chain, i);

			if (!X509_cmp(x, peer))
				continue;
			v = pem_str(x);
			rc = !v || PyList_Append(list, v) < 0;
			Py_XDECREF(v);
		}
	}
	if (!rc && !peer)
		rc = PyDict_SetItemString(d, "client_cert_name", Py_None) < 0;
	if (!rc)
		rc = PyDict_SetItemString(d, "client_cert_chain", list) < 0 ||
		     PyDict_SetItemString(d, "server_cert", c->srv->tls_server_pem
		                          ? c->srv->tls_server_pem : Py_None) < 0 ||
		     (peer && vr != X509_V_OK
		      ? dict_put(d, "client_cert_error", PyUnicode_FromString(X509_verify_cert_error_string(vr)))
		      : PyDict_SetItemString(d, "client_cert_error", Py_None)) < 0 ||
		     dict_put(d, "tls_version", PyLong_FromLong(SSL_version(c->ssl))) < 0 ||
		     dict_put(d, "cipher_suite", PyLong_FromLong(
		         SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(c->ssl)))) < 0;
	X509_free(peer);
	Py_XDECREF(list);
	ERR_clear_error();
	if (rc) {
		Py_XDECREF(d);
		return NULL;
	}
	return d;
}
