/* What the TLS files of the connection layer share (conn_tls.c,
 * conn_tls_info.c, conn_tls_load.c, conn_tls_tickets.c, conn_tls_ctx.c). Not part of the
 * layer's interface (conn_tls.h): only those include it.
 */
#ifndef SOCKHERD_CONN_TLS_INT_H
#define SOCKHERD_CONN_TLS_INT_H

#include <Python.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

/* conn_tls.c: our BIO's method, made once (Server.set_tls). 0, or -1
 * with a Python error. */
int bio_setup(void);
/* conn_tls_info.c: a certificate in PEM, as str (NULL: a Python error) */
PyObject *pem_str(X509 *x);
/* conn_tls_load.c: a ValueError "WHAT PATH: why" (OpenSSL's reason, an
 * errno's text for a system error); NULL */
PyObject *tls_error(const char *what, const char *path);
/* conn_tls_load.c: the certificate chain, key, client CAs into ctx from
 * pem (bytes; NULL: read path). 0, or -1 with a Python error. */
int tls_load_cert(SSL_CTX *ctx, const char *path, PyObject *pem);
int tls_load_key(SSL_CTX *ctx, const char *path, PyObject *pem);
int tls_load_ca(SSL_CTX *ctx, const char *path, PyObject *pem);
/* conn_tls_tickets.c: ctx's session tickets, keys derived from secret
 * (32 bytes, of epoch; NULL: a random one) and the policy digest, rotated
 * every rotation seconds. 0, or -1 (OpenSSL failed; no Python error). */
int tickets_install(SSL_CTX *ctx, const unsigned char *secret, long long epoch,
                    long long rotation, const unsigned char policy[32]);

#endif /* SOCKHERD_CONN_TLS_INT_H */
