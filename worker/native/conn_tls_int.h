/* What the TLS files of the connection layer share (conn_tls.c,
 * conn_tls_info.c, conn_tls_ctx.c). Not part of the layer's interface
 * (conn_tls.h): only those three include it.
 */
#ifndef SOCKHERD_CONN_TLS_INT_H
#define SOCKHERD_CONN_TLS_INT_H

#include <Python.h>
#include <openssl/x509.h>

/* conn_tls.c: our BIO's method, made once (Server.set_tls). 0, or -1
 * with a Python error. */
int bio_setup(void);
/* conn_tls_info.c: a certificate in PEM, as str (NULL: a Python error) */
PyObject *pem_str(X509 *x);

#endif /* SOCKHERD_CONN_TLS_INT_H */
