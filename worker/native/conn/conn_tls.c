/* The TLS step of the connection layer: OpenSSL (Debian's libssl) driven
 * non-blockingly on the loop thread (docs/ARCHITECTURE.md says why not
 * Python's ssl memory BIO). Bytes, bottom up:
 *
 *   socket -> [PROXY header, in clear: conn_proxy.c] -> first byte looked
 *   at (0x16, a TLS handshake record; else plain HTTP sent to a TLS port:
 *   nginx's 400, in clear) -> SSL (handshake, records) -> the codec
 *
 * Some facts about non-blocking OpenSSL, and what they mean here:
 *   - A read may need to write (the handshake's flight, an alert) and a
 *     write may need to read (a renegotiation: refused here with
 *     SSL_OP_NO_RENEGOTIATION, but the mapping is kept): SSL_read's
 *     WANT_WRITE sets tls_rw, which wants POLLOUT and turns a POLLOUT
 *     into a read (conn_events.c, conn_on_events); SSL_write's WANT_READ
 *     sets tls_wr, which wants POLLIN and turns input into a flush.
 *   - SSL holds bytes the socket no longer has (decrypted, or records
 *     read ahead: SSL_has_pending):
 *     no poll report announces them. A read fills its room and the codec
 *     reads again while tls_buffered (h1_conn.c); a connection whose
 *     reading stopped with such bytes and starts again is queued for a
 *     read at its thread's next turn (tls_replay, engine.c).
 *   - A write retried after WANT_WRITE must offer the same bytes again
 *     (at least as many): every TLS write goes through the connection's
 *     output buffer (conn_io.c conn_flush), which only grows at its end
 *     and moves its start past what was taken, so a retry always starts
 *     with the same bytes; SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER lets the
 *     buffer move (realloc), SSL_MODE_ENABLE_PARTIAL_WRITE returns after
 *     each record the kernel took.
 *   - OpenSSL's error queue is the thread's, shared with Python's ssl
 *     module: it is left empty after every call here.
 *
 * This file: the BIO and one connection's reads, writes and close; what
 * the session tells the app (the environ's and the ASGI scope's TLS
 * keys) is conn_tls_info.c, the context (Server.set_tls)
 * conn_tls_ctx.c; conn_tls_int.h between them.
 *
 * The BIO is our own (a few lines below): it reads the bytes held ahead
 * of the SSL first (a PROXY header's tail, the first byte looked at),
 * then the fd, and records EAGAIN and the end of input for the caller.
 *
 * Above conn_io.c and conn_proxy.c in the connection layer, which reach
 * it through the Server's struct tls_ops (conn.h). May call: conn_io.c
 * (close, send, fdcore's directions through conn_sync, the refusal
 * log), conn_proxy.c (the header). The queued reads run in engine.c's
 * turn (tls_replay_run).
 */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "server.h"
#include "conn_tls.h"
#include "conn_tls_int.h"


/* ---- the BIO: our fd, with the bytes read ahead of the SSL first ---------------------------- */

static BIO_METHOD *bio_method;

static void pre_drop(struct conn *c)
{
	PyMem_Free(c->tls_pre);
	c->tls_pre = NULL;
	c->tls_pre_start = c->tls_pre_len = c->tls_pre_cap = 0;
}

static int bio_read(BIO *b, char *out, int n)
{
	struct conn *c = BIO_get_data(b);
	size_t left = c->tls_pre_len - c->tls_pre_start;
	ssize_t r;

	BIO_clear_retry_flags(b);
	if (left) {
		size_t k = left < (size_t)n ? left : (size_t)n;

		memcpy(out, c->tls_pre + c->tls_pre_start, k);
		c->tls_pre_start += k;
		if (c->tls_pre_start == c->tls_pre_len)
			pre_drop(c);
		return (int)k;
	}
	do
		r = read(c->fd, out, (size_t)n);
	while (r < 0 && errno == EINTR);
	if (r < 0 && errno == EAGAIN) {
		c->tls_eagain = 1;
		BIO_set_retry_read(b);
	}
	if (r == 0)
		c->tls_eof = 1;
	c->tls_short = r > 0 && r < n;              /* the socket was empty after it */
	return (int)r;
}

static int bio_write(BIO *b, const char *in, int n)
{
	struct conn *c = BIO_get_data(b);
	ssize_t w;

	BIO_clear_retry_flags(b);
	do
		w = write(c->fd, in, (size_t)n);
	while (w < 0 && errno == EINTR);
	if (w < 0 && errno == EAGAIN)
		BIO_set_retry_write(b);
	return (int)w;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
	(void)b;
	(void)num;
	(void)ptr;
	return cmd == BIO_CTRL_FLUSH;               /* writes are never held here */
}

int bio_setup(void)
{
	if (bio_method)
		return 0;
	bio_method = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "sockherd fd");
	if (!bio_method || !BIO_meth_set_read(bio_method, bio_read) ||
	    !BIO_meth_set_write(bio_method, bio_write) || !BIO_meth_set_ctrl(bio_method, bio_ctrl)) {
		ERR_clear_error();
		PyErr_NoMemory();
		return -1;
	}
	return 0;
}

/* ---- one connection ------------------------------------------------------------------------ */

int tls_open(struct conn *c)
{
	SSL *ssl;
	BIO *bio;

	/* no context, or a plain listener beside TLS ones (engine.c) */
	if (!c->srv->tls_ctx || c->srv->thr[c->pos].plain)
		return 0;
	ssl = SSL_new(c->srv->tls_ctx);
	bio = ssl ? BIO_new(bio_method) : NULL;
	if (!bio) {
		SSL_free(ssl);
		ERR_clear_error();
		PyErr_NoMemory();
		return -1;
	}
	BIO_set_data(bio, c);
	BIO_set_init(bio, 1);
	SSL_set_bio(ssl, bio, bio);
	SSL_set_accept_state(ssl);
	c->ssl = ssl;
	/* the handshake counts against header_timeout: the header timer
	 * armed at accept (head_clock set, engine_accept.c) runs on through it, and
	 * is the first head's too */
	return 0;
}

void tls_free(struct conn *c)
{
	if (c->ssl) {
		/* Every close passes here: a handshake begun (its first byte
		 * seen) whose outcome was not counted (completed, failed, plain
		 * HTTP: tls_done) was abandoned, whatever closed it: the client's
		 * close or reset (its report a POLLERR, or a read that only said
		 * "not yet": a whole ClientHello then a close was counted nowhere),
		 * header_timeout, a drain. No TLS error was seen: not a failure. */
		if (c->tls_checked && !c->tls_done) {
			c->tls_done = 1;
			c->srv->tls_abandoned++;
		}
		SSL_free(c->ssl);                      /* its BIO with it */
		c->ssl = NULL;
	}
	pre_drop(c);
	Py_CLEAR(c->tls_env);
}

/* The close's side (tls_ops.free, conn_close_now: the fd still open, its
 * delete deferred): a connection whose first byte was never looked at may
 * have one waiting. A client that sent its ClientHello and reset at once
 * can have its reset reported (POLLERR) before the loop read a byte, and
 * the close then comes without a read: Linux keeps the bytes that
 * arrived before a reset readable (recv returns them, then ECONNRESET).
 * A peek at the first of them decides as the read would have: a
 * handshake record begun (abandoned, by tls_free) or plain HTTP; none
 * (no byte, or the reset alone) is no handshake. Without it the same
 * client landed in an outcome or in none depending on whether the loop
 * read before the reset came (docs/ARCHITECTURE.md, "Handshake outcomes"). Not at
 * a dealloc (tls_free alone): the fd may be another connection's by then. */
static void tls_close(struct conn *c)
{
	unsigned char first;
	ssize_t n;

	if (c->ssl && !c->tls_checked && !c->proxy_wait
	    && c->tls_pre_len == c->tls_pre_start) {
		do
			n = recv(c->fd, &first, 1, MSG_PEEK | MSG_DONTWAIT);
		while (n < 0 && errno == EINTR);
		if (n == 1) {
			c->tls_checked = 1;
			if (first != 0x16) {
				c->srv->tls_plain++;    /* what the read would have refused */
				c->tls_done = 1;
			}
		}
	}
	tls_free(c);
}

int tls_buffered(const struct conn *c)
{
	/* has_pending: decrypted bytes, and records read ahead (a whole one
	 * or a part: a part costs one read that finds nothing) */
	return c->ssl && (SSL_has_pending(c->ssl) || c->tls_pre_len > c->tls_pre_start);
}

/* Plain HTTP sent to a TLS port: nginx's answer, in clear, and a close
 * (the request's bytes dropped; its rest is read by the lingering close). */
static void plain_http(struct conn *c)
{
	static const char body[] = "400 Bad Request: The plain HTTP request was sent to HTTPS port\n";
	char head[256];
	int n = snprintf(head, sizeof(head), "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
	                 "Content-Length: %zu\r\nConnection: close\r\n\r\n", sizeof(body) - 1);

	c->srv->tls_plain++;
	c->tls_done = 1;                           /* its outcome: not abandoned (tls_free) */
	srv_log_refusal(c->srv, c->peer, 400, "plain HTTP sent to a TLS port");
	tls_free(c);
	if (conn_send(c, head, (size_t)n, 0) < 0 || conn_send(c, body, sizeof(body) - 1, 0) < 0)
		PyErr_Clear();                         /* no memory: the close says enough */
	conn_close_soft(c);
	conn_flush(c);
}

/* What comes before the session: the PROXY header (its step consumes the
 * bytes it needs from tls_pre), then the first byte. 1: the SSL's turn,
 * 0: nothing now (more bytes needed, or c closed), -2 the end of input,
 * -1 a Python error. */
static int pre_step(struct conn *c)
{
	for (;;) {
		size_t have = c->tls_pre_len - c->tls_pre_start;
		ssize_t n;

		if (have && c->proxy_wait) {
			ssize_t used = conn_proxy_read(c, c->tls_pre + c->tls_pre_start, have, 0);

			if (used < 0)
				return -1;
			c->tls_pre_start += (size_t)used;
			if (c->closed)
				return 0;
			if (!c->proxy_wait)
				continue;
		}
		else if (have) {
			c->tls_checked = 1;
			if ((unsigned char)c->tls_pre[c->tls_pre_start] != 0x16) {
				plain_http(c);
				return 0;
			}
			return 1;
		}
		if (buf_reserve(&c->tls_pre, &c->tls_pre_start, &c->tls_pre_len, &c->tls_pre_cap,
		                4096) < 0)
			return -1;
		do
			n = read(c->fd, c->tls_pre + c->tls_pre_len, c->tls_pre_cap - c->tls_pre_len);
		while (n < 0 && errno == EINTR);
		if (n > 0) {
			c->tls_pre_len += (size_t)n;
			continue;
		}
		if (n < 0 && errno == EAGAIN) {
			conn_cant_recv(c);
			return 0;
		}
		if (n < 0) {
			conn_fail(c);
			return 0;
		}
		/* the end before the session: a header cut short is refused */
		if (c->proxy_wait && conn_proxy_read(c, c->tls_pre + c->tls_pre_start, have, 1) < 0)
			return -1;
		return c->closed ? 0 : -2;
	}
}

/* A handshake (or a record) that failed: counted, logged (the refusal
 * log: at most a line a second), closed. A client that closed or reset
 * before its handshake ended, with no TLS error of its own, is counted
 * abandoned by the close (tls_free), not logged: a port scan, a TCP
 * health check or a load tool stopping does that, and nginx logs it at
 * info, not as an error. */
static void failed(struct conn *c)
{
	unsigned long e = ERR_peek_last_error();
	const char *why = e ? ERR_reason_error_string(e) : NULL;
	char reason[200];

	if (!SSL_is_init_finished(c->ssl) && why) {
		c->srv->tls_failed++;
		c->tls_done = 1;                        /* its outcome: not abandoned (tls_free) */
		snprintf(reason, sizeof(reason), "TLS handshake failed: %s", why);
		srv_log_refusal(c->srv, c->peer, 0, reason);
	}
	ERR_clear_error();
	conn_fail(c);
}

ssize_t tls_read(struct conn *c, char *buf, size_t room)
{
	size_t got = 0;
	int e = SSL_ERROR_NONE;

	if (c->proxy_wait || !c->tls_checked) {
		int rc = pre_step(c);

		if (rc <= 0)
			return rc;
	}
	c->tls_eagain = c->tls_eof = c->tls_short = 0;
	while (got < room) {
		size_t want = room - got;
		int r = SSL_read(c->ssl, buf + got, want > INT_MAX ? INT_MAX : (int)want);

		if (r > 0) {
			got += (size_t)r;
			/* the socket was empty after the last read and the session
			 * holds nothing: what a plain short read means, without a
			 * read(2) that would only say EAGAIN (measured: a third of
			 * the per-request cost) */
			if (c->tls_short && !SSL_has_pending(c->ssl))
				break;
			continue;
		}
		e = SSL_get_error(c->ssl, r);
		break;
	}
	if (!c->tls_done && SSL_is_init_finished(c->ssl)) {
		c->tls_done = 1;                        /* the handshake's end, counted once */
		c->srv->tls_handshakes++;
		c->srv->tls_resumed += SSL_session_reused(c->ssl) != 0;
	}
	if (c->tls_rw != (e == SSL_ERROR_WANT_WRITE)) {
		c->tls_rw = e == SSL_ERROR_WANT_WRITE;  /* the handshake's flight waits for room */
		conn_sync(c);
	}
	switch (e) {
	case SSL_ERROR_NONE:                        /* the room is full */
	case SSL_ERROR_WANT_WRITE:
		break;
	case SSL_ERROR_WANT_READ:
		if (c->tls_eagain)
			conn_cant_recv(c);
		break;
	case SSL_ERROR_ZERO_RETURN:                 /* the client's close_notify */
		ERR_clear_error();
		if (!got)
			return -2;
		tls_replay(c);                          /* the end, once these bytes are read */
		break;
	case SSL_ERROR_SYSCALL:
		if (c->tls_eof && SSL_is_init_finished(c->ssl)) {
			ERR_clear_error();                  /* an end without close_notify */
			if (!got)
				return -2;
			tls_replay(c);
			break;
		}
		/* fall through: a reset, or an end in the handshake */
	default:
		if (got) {
			tls_replay(c);                      /* the error again, after these bytes */
			break;
		}
		failed(c);
		return 0;
	}
	ERR_clear_error();
	return (ssize_t)got;
}

ssize_t tls_write(struct conn *c, const char *buf, size_t n)
{
	size_t took = 0;
	int wr = 0;

	while (took < n) {
		/* bounded, and never below what a retry after WANT_WRITE asked:
		 * the output only grows at its end */
		size_t want = n - took < (1u << 20) ? n - took : (1u << 20);
		int r = SSL_write(c->ssl, buf + took, (int)want);
		int e;

		if (r > 0) {
			took += (size_t)r;
			continue;
		}
		e = SSL_get_error(c->ssl, r);
		if (e == SSL_ERROR_WANT_WRITE)
			break;
		if (e == SSL_ERROR_WANT_READ) {
			wr = 1;
			break;
		}
		ERR_clear_error();
		return took ? (ssize_t)took : -1;
	}
	c->tls_wr = (unsigned)wr;
	ERR_clear_error();
	return (ssize_t)took;
}

/* Our close_notify ahead of the FIN (best effort: what the kernel takes
 * now), so a client can tell our end from a cut. */
void tls_close_notify(struct conn *c)
{
	if (c->ssl && SSL_is_init_finished(c->ssl) && !(SSL_get_shutdown(c->ssl) & SSL_SENT_SHUTDOWN))
		SSL_shutdown(c->ssl);
	ERR_clear_error();
}

/* ---- input held in the session: read at the owner's next turn --------------------------------- */

void tls_replay(struct conn *c)
{
	Server *s = c->srv;
	struct srv_thread *t = &s->thr[c->pos];

	if (c->tls_queued || c->closed)
		return;
	c->tls_queued = 1;
	c->tls_next = t->tls_replay;
	t->tls_replay = (struct conn *)Py_NewRef(c);
	if (srv_current(s) != c->pos)
		s->api.wake(s->table, t->tid);
}

/* The queues emptied (the engine's end, or its clear). */
void tls_replay_free(Server *s)
{
	for (int i = 0; s->thr && i < s->nthreads; i++)
		while (s->thr[i].tls_replay) {
			struct conn *c = s->thr[i].tls_replay;

			s->thr[i].tls_replay = c->tls_next;
			c->tls_next = NULL;
			c->tls_queued = 0;
			Py_DECREF(c);
		}
}

const struct tls_ops tls_ops = {
	.read = tls_read, .write = tls_write, .free = tls_close, .buffered = tls_buffered,
	.replay = tls_replay, .close_notify = tls_close_notify,
};
