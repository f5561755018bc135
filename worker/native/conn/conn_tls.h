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
/* ---- what c's TLS session says (conn_tls_info.c), in no interface's
 * names: the adapters show it as theirs (the environ's SSL_* keys, the
 * ASGI "tls" extension). c->ssl set; loop thread, GIL held. ---- */
struct tls_facts {
	const char *protocol;              /* "TLSv1.3" (OpenSSL's name) */
	const char *cipher;                /* the cipher's OpenSSL name */
	int resumed;                       /* a resumed session */
	const char *sni;                   /* the server name as the client sent it (any
	                                    * bytes but NUL; OpenSSL's), NULL none */
	int version;                       /* the protocol's number (0x0304: TLS 1.3) */
	int cipher_id;                     /* the cipher suite's IANA number */
};
void tls_facts(struct conn *c, struct tls_facts *f);
/* The client's certificate: 1 with p filled (new references: subject and
 * issuer as RFC 2253 text, nginx's $ssl_client_s_dn; the serial in hex;
 * the certificate in PEM), 0 it sent none (p's NULL), -1 a Python error. */
struct tls_peer {
	PyObject *subject, *issuer, *serial, *pem;
};
int tls_peer(struct conn *c, struct tls_peer *p);
void tls_peer_clear(struct tls_peer *p);
/* The client certificate's subject alone (as tls_peer's), None without
 * one (*has_peer says which), NULL with a Python error: what a scope
 * built per request needs, without the rest's cost. */
PyObject *tls_peer_subject(struct conn *c, int *has_peer);
/* The client's verification as nginx words it: "SUCCESS", "NONE" (no
 * certificate: has_peer 0) or "FAILED:reason"; a new str or NULL. */
PyObject *tls_verify_text(struct conn *c, int has_peer);
/* Why the client's certificate failed verification (a str), or None. */
PyObject *tls_verify_error(struct conn *c, int has_peer);
/* The client's certificates in PEM, its own first, then the chain it
 * sent (a new list; empty without one), or NULL with a Python error. */
PyObject *tls_peer_chain(struct conn *c);

extern PyMethodDef server_tls_methods[];   /* Server.set_tls */
extern const struct tls_ops tls_ops;       /* conn.h: what conn_io.c calls */

#endif /* SOCKHERD_CONN_TLS_H */
