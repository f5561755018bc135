/* What the TLS files of the connection layer share (conn_tls.c,
 * conn_tls_info.c, conn_tls_tickets.c, conn_tls_ctx.c). Not part of the
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
/* conn_tls_tickets.c: ctx's session tickets, keys derived from secret
 * (32 bytes, of epoch; NULL: a random one) and the policy digest, rotated
 * every rotation seconds. 0, or -1 (OpenSSL failed; no Python error). */
int tickets_install(SSL_CTX *ctx, const unsigned char *secret, long long epoch,
                    long long rotation, const unsigned char policy[32]);

#endif /* SOCKHERD_CONN_TLS_INT_H */
