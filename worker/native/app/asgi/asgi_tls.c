/* The ASGI "tls" extension (the TLS extension's spec: client_cert_name,
 * client_cert_chain, client_cert_error, server_cert, tls_version,
 * cipher_suite) of a TLS connection: the connection layer reads the
 * session (conn_tls_info.c), this file only names what it read.
 *
 * May call: the connection layer's TLS step (conn_tls.h).
 */
#include "asgi.h"
#include "conn_tls.h"

PyObject *asgi_tls_scope(struct conn *c)
{
	struct tls_facts f;
	PyObject *d = PyDict_New();
	int rc = !d, has = 0;

	tls_facts(c, &f);
	if (!rc)
		rc = dict_put(d, "client_cert_name", tls_peer_subject(c, &has)) < 0 ||
		     dict_put(d, "client_cert_chain", tls_peer_chain(c)) < 0 ||
		     PyDict_SetItemString(d, "server_cert", c->srv->tls_server_pem
		                          ? c->srv->tls_server_pem : Py_None) < 0 ||
		     dict_put(d, "client_cert_error", tls_verify_error(c, has)) < 0 ||
		     dict_put(d, "tls_version", PyLong_FromLong(f.version)) < 0 ||
		     dict_put(d, "cipher_suite", PyLong_FromLong(f.cipher_id)) < 0;
	if (rc) {
		Py_XDECREF(d);
		return NULL;
	}
	return d;
}
