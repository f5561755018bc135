/* The TLS step of the connection layer (conn_tls.c): OpenSSL driven
 * non-blockingly on the loop thread, between the PROXY protocol header
 * (in clear, ahead of the ClientHello: conn_proxy.c) and the codec.
 *
 * The layers above never see TLS: they read through conn_read and write
 * through the connection's output (conn_send, conn_flush), which take
 * this path when c->ssl is set; the few that wrote to the fd themselves
 * (writev of a WSGI list's tail, sendfile of a file) go through
 * conn_sendfile or copy into the output under TLS (wsgi_body.c).
 *
 * The Server's SSL_CTX is built once per worker (Server.set_tls, from the
 * settings at start), so a reload, which starts new workers, reads the
 * certificate and key again.
 */
#ifndef SOCKHERD_CONN_TLS_H
#define SOCKHERD_CONN_TLS_H

#include "conn.h"

/* A new connection of a TLS Server: its SSL, in accept state (none if
 * its listener is plain: srv_thread.plain, engine.c). -1: a
 * Python error (c is not served). */
int tls_open(struct conn *c);
/* c's SSL and buffers released (its close, its dealloc). */
void tls_free(struct conn *c);
/* conn_read's TLS side: the same contract (> 0 bytes of plaintext, 0
 * nothing now, -2 end of input, -1 a Python error). */
ssize_t tls_read(struct conn *c, char *buf, size_t room);
/* Encrypts and sends what the kernel takes of buf[0 .. n): the plaintext
 * bytes taken (0: none now; the directions to wait for are set on c), or
 * -1: the connection failed (the caller closes it). */
ssize_t tls_write(struct conn *c, const char *buf, size_t n);
/* Plaintext decrypted and not yet read, or bytes this layer holds ahead
 * of the SSL (a PROXY header's tail): input that no poll report will
 * announce. */
int tls_buffered(const struct conn *c);
/* Reading is on again for c, which may hold such input: its owner loop
 * thread reads it at its next turn (tls_replay_run). */
void tls_replay(struct conn *c);
void tls_replay_free(Server *s);
/* Our close_notify, ahead of the connection's FIN. */
void tls_close_notify(struct conn *c);
/* The environ keys of c's TLS session (SSL_PROTOCOL, SSL_CIPHER,
 * SSL_CLIENT_*: nginx's and Apache's names), a dict built once per
 * connection; borrowed, NULL with a Python error. */
PyObject *tls_environ(struct conn *c);
/* The ASGI "tls" extension's dict for c (a new one per call), or NULL
 * with a Python error. */
PyObject *tls_scope(struct conn *c);

extern PyMethodDef server_tls_methods[];   /* Server.set_tls */
extern const struct tls_ops tls_ops;       /* conn.h: what conn_io.c calls */

#endif /* SOCKHERD_CONN_TLS_H */
