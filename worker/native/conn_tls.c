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
 *     into a read (conn_io.c, hconn_on_events); SSL_write's WANT_READ
 *     sets tls_wr, which wants POLLIN and turns input into a flush.
 *   - SSL holds bytes the socket no longer has (decrypted, or records
 *     read ahead: SSL_has_pending):
 *     no poll report announces them. A read fills its room and the codec
 *     reads again while tls_buffered (h1_conn.c); a connection whose
 *     reading stopped with such bytes and starts again is queued for a
 *     read at its thread's next turn (tls_replay, engine.c).
 *   - A write retried after WANT_WRITE must offer the same bytes again
 *     (at least as many): every TLS write goes through the connection's
 *     output buffer (conn_io.c hconn_flush), which only grows at its end
 *     and moves its start past what was taken, so a retry always starts
 *     with the same bytes; SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER lets the
 *     buffer move (realloc), SSL_MODE_ENABLE_PARTIAL_WRITE returns after
 *     each record the kernel took.
 *   - OpenSSL's error queue is the thread's, shared with Python's ssl
 *     module: it is left empty after every call here.
 *
 * The BIO is our own (a few lines below): it reads the bytes held ahead
 * of the SSL first (a PROXY header's tail, the first byte looked at),
 * then the fd, and records EAGAIN and the end of input for the caller.
 *
 * Above conn_io.c and conn_proxy.c in the connection layer, which reach
 * it through the Server's struct tls_ops (conn.h). May call: conn_io.c
 * (close, send, fdcore's directions through hconn_sync, the refusal
 * log), conn_proxy.c (the header). The queued reads run in engine.c's
 * turn (tls_replay_run).
 */
#include <errno.h>
#include <limits.h>
#include <string.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "engine.h"
#include "conn_tls.h"

/* ---- the BIO: our fd, with the bytes read ahead of the SSL first ---------------------------- */

static BIO_METHOD *bio_method;

static void pre_drop(HttpConn *c)
{
	PyMem_Free(c->tls_pre);
	c->tls_pre = NULL;
	c->tls_pre_start = c->tls_pre_len = c->tls_pre_cap = 0;
}

static int bio_read(BIO *b, char *out, int n)
{
	HttpConn *c = BIO_get_data(b);
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
	HttpConn *c = BIO_get_data(b);
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

static int bio_setup(void)
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

int tls_open(HttpConn *c)
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
	 * armed at accept (head_clock set, engine.c) runs on through it, and
	 * is the first head's too */
	return 0;
}

void tls_free(HttpConn *c)
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

int tls_buffered(const HttpConn *c)
{
	/* has_pending: decrypted bytes, and records read ahead (a whole one
	 * or a part: a part costs one read that finds nothing) */
	return c->ssl && (SSL_has_pending(c->ssl) || c->tls_pre_len > c->tls_pre_start);
}

/* Plain HTTP sent to a TLS port: nginx's answer, in clear, and a close
 * (the request's bytes dropped; its rest is read by the lingering close). */
static void plain_http(HttpConn *c)
{
	static const char body[] = "400 Bad Request: The plain HTTP request was sent to HTTPS port\n";
	char head[256];
	int n = snprintf(head, sizeof(head), "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
	                 "Content-Length: %zu\r\nConnection: close\r\n\r\n", sizeof(body) - 1);

	c->srv->tls_plain++;
	c->tls_done = 1;                           /* its outcome: not abandoned (tls_free) */
	srv_log_refusal(c->srv, c->peer, 400, "plain HTTP sent to a TLS port");
	tls_free(c);
	if (hconn_send(c, head, (size_t)n, 0) < 0 || hconn_send(c, body, sizeof(body) - 1, 0) < 0)
		PyErr_Clear();                         /* no memory: the close says enough */
	hconn_close_soft(c);
	hconn_flush(c);
}

/* What comes before the session: the PROXY header (its step consumes the
 * bytes it needs from tls_pre), then the first byte. 1: the SSL's turn,
 * 0: nothing now (more bytes needed, or c closed), -2 the end of input,
 * -1 a Python error. */
static int pre_step(HttpConn *c)
{
	for (;;) {
		size_t have = c->tls_pre_len - c->tls_pre_start;
		ssize_t n;

		if (have && c->proxy_wait) {
			ssize_t used = hconn_proxy(c, c->tls_pre + c->tls_pre_start, have, 0);

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
			hconn_cant_recv(c);
			return 0;
		}
		if (n < 0) {
			hconn_fail(c);
			return 0;
		}
		/* the end before the session: a header cut short is refused */
		if (c->proxy_wait && hconn_proxy(c, c->tls_pre + c->tls_pre_start, have, 1) < 0)
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
static void failed(HttpConn *c)
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
	hconn_fail(c);
}

ssize_t tls_read(HttpConn *c, char *buf, size_t room)
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
		hconn_sync(c);
	}
	switch (e) {
	case SSL_ERROR_NONE:                        /* the room is full */
	case SSL_ERROR_WANT_WRITE:
		break;
	case SSL_ERROR_WANT_READ:
		if (c->tls_eagain)
			hconn_cant_recv(c);
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

ssize_t tls_write(HttpConn *c, const char *buf, size_t n)
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
void tls_close_notify(HttpConn *c)
{
	if (c->ssl && SSL_is_init_finished(c->ssl) && !(SSL_get_shutdown(c->ssl) & SSL_SENT_SHUTDOWN))
		SSL_shutdown(c->ssl);
	ERR_clear_error();
}

/* ---- input held in the session: read at the owner's next turn --------------------------------- */

void tls_replay(HttpConn *c)
{
	Server *s = c->srv;
	struct srv_thread *t = &s->thr[c->pos];

	if (c->tls_queued || c->closed)
		return;
	c->tls_queued = 1;
	c->tls_next = t->tls_replay;
	t->tls_replay = (HttpConn *)Py_NewRef(c);
	if (srv_current(s) != c->pos)
		s->api.wake(s->table, t->tid);
}

/* The queues emptied (the engine's end, or its clear). */
void tls_replay_free(Server *s)
{
	for (int i = 0; s->thr && i < s->nthreads; i++)
		while (s->thr[i].tls_replay) {
			HttpConn *c = s->thr[i].tls_replay;

			s->thr[i].tls_replay = c->tls_next;
			c->tls_next = NULL;
			c->tls_queued = 0;
			Py_DECREF(c);
		}
}

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
static PyObject *pem_str(X509 *x) { return bio_text(fill_pem, x); }

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

PyObject *tls_environ(HttpConn *c)
{
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
	if (!rc && SSL_get_servername(c->ssl, TLSEXT_NAMETYPE_host_name))
		rc = dict_put(d, "SSL_TLS_SNI",
		         PyUnicode_FromString(SSL_get_servername(c->ssl, TLSEXT_NAMETYPE_host_name)));
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

PyObject *tls_scope(HttpConn *c)
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

const struct tls_ops tls_ops = {
	.read = tls_read, .write = tls_write, .free = tls_free, .buffered = tls_buffered,
	.replay = tls_replay, .close_notify = tls_close_notify,
};

/* ---- the context: Server.set_tls ---------------------------------------------------------------- */

static const unsigned char ALPN_H1[] = "\x08http/1.1";

/* ALPN: http/1.1 when offered (h2 would be chosen here once a codec
 * exists); a client that offers only others goes on without ALPN, as
 * nginx does, rather than failing its handshake. */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
	(void)ssl;
	(void)arg;
	if (SSL_select_next_proto((unsigned char **)out, outlen, ALPN_H1, sizeof(ALPN_H1) - 1, in,
	                          inlen) == OPENSSL_NPN_NEGOTIATED)
		return SSL_TLSEXT_ERR_OK;
	return SSL_TLSEXT_ERR_NOACK;
}

static int password_cb(char *buf, int size, int rwflag, void *u)
{
	PyObject *pw = u;
	Py_ssize_t n;

	(void)rwflag;
	if (!pw)
		return 0;
	n = PyBytes_GET_SIZE(pw);
	if (n > size)
		return 0;
	memcpy(buf, PyBytes_AS_STRING(pw), (size_t)n);
	return (int)n;
}

/* The certificate chain a handshake sends, built here once. A certfile
 * holding only its leaf leaves the context without a chain, and then
 * OpenSSL builds one in every handshake (ssl_add_cert_chain: an
 * X509_STORE_CTX, X509_verify_cert against the context's store, the
 * errors it raises cleared): about 1 % of a worker's cycles per full
 * handshake (perf), 0.1 % of its instructions (callgrind): allocations
 * and lookups. SSL_CTX_build_cert_chain makes the same chain (the same
 * store, the root kept) and keeps it, even when empty, which turns the
 * per-handshake build off. A certfile with its chain in it is left as it
 * is (OpenSSL sends that file's certificates and builds nothing); a build
 * that fails leaves the context as it was (OpenSSL's per-handshake build,
 * which fails the same way and says so to the client). */
static void chain_once(SSL_CTX *ctx)
{
	STACK_OF(X509) *given = NULL;

	if (SSL_CTX_get0_chain_certs(ctx, &given) == 1 && !given)
		(void)SSL_CTX_build_cert_chain(ctx, SSL_BUILD_CHAIN_FLAG_IGNORE_ERROR);
	ERR_clear_error();
}

/* A ValueError naming what failed (and the file), with OpenSSL's reason. */
static PyObject *ssl_error(const char *what, const char *path)
{
	unsigned long e = ERR_peek_last_error();
	const char *why = e ? ERR_reason_error_string(e) : NULL;

	PyErr_Format(PyExc_ValueError, "%s %s: %s", what, path ? path : "", why ? why : "failed");
	ERR_clear_error();
	return NULL;
}

static PyObject *Server_set_tls(Server *s, PyObject *args, PyObject *kw)
{
	static char *names[] = {"certfile", "keyfile", "password", "ca_certs", "cert_reqs", "ciphers",
	                        "min_version", "ticket_keys", NULL};
	const char *certfile, *keyfile = "", *ca = "", *reqs = "none", *ciphers = "",
	           *minv = "TLSv1.2";
	PyObject *password = Py_None, *tickets = Py_None, *pem = NULL;
	SSL_CTX *ctx;
	int mode, version;

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|sOssssO:set_tls", names, &certfile, &keyfile,
	                                 &password, &ca, &reqs, &ciphers, &minv, &tickets))
		return NULL;
	if (password != Py_None && !PyBytes_Check(password)) {
		PyErr_SetString(PyExc_TypeError, "set_tls: password must be bytes or None");
		return NULL;
	}
	/* OpenSSL's ticket keys: a 16-byte name, a 32-byte HMAC and a 32-byte
	 * AES key */
	if (tickets != Py_None && (!PyBytes_Check(tickets) || PyBytes_GET_SIZE(tickets) != 80)) {
		PyErr_SetString(PyExc_ValueError, "set_tls: ticket_keys must be 80 bytes or None");
		return NULL;
	}
	if (!strcmp(reqs, "none"))
		mode = SSL_VERIFY_NONE;
	else if (!strcmp(reqs, "optional"))
		mode = SSL_VERIFY_PEER;
	else if (!strcmp(reqs, "required"))
		mode = SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
	else {
		PyErr_Format(PyExc_ValueError, "cert_reqs %R: one of none, optional, required", reqs);
		return NULL;
	}
	if (!strcmp(minv, "TLSv1.2"))
		version = TLS1_2_VERSION;
	else if (!strcmp(minv, "TLSv1.3"))
		version = TLS1_3_VERSION;
	else {
		PyErr_Format(PyExc_ValueError, "ssl_min_version %R: TLSv1.2 or TLSv1.3", minv);
		return NULL;
	}
	if (bio_setup() < 0)
		return NULL;
	ERR_clear_error();
	ctx = SSL_CTX_new(TLS_server_method());
	if (!ctx)
		return ssl_error("an SSL context", NULL);
	SSL_CTX_set_min_proto_version(ctx, version);
	/* read ahead: a read(2) takes what the socket has (records and all),
	 * not a record's 5-byte header and then its body */
	SSL_CTX_set_read_ahead(ctx, 1);
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE |
	                         SSL_OP_NO_COMPRESSION);
	/* RELEASE_BUFFERS: an idle keep-alive connection holds no record buffers */
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
	                      SSL_MODE_RELEASE_BUFFERS);
	if (password != Py_None) {
		SSL_CTX_set_default_passwd_cb(ctx, password_cb);
		SSL_CTX_set_default_passwd_cb_userdata(ctx, password);
	}
	if (SSL_CTX_use_certificate_chain_file(ctx, certfile) != 1) {
		ssl_error("certfile", certfile);
		goto fail;
	}
	if (SSL_CTX_use_PrivateKey_file(ctx, *keyfile ? keyfile : certfile, SSL_FILETYPE_PEM) != 1) {
		ssl_error("keyfile", *keyfile ? keyfile : certfile);
		goto fail;
	}
	/* the password is needed no more: never kept past this call */
	SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
	if (SSL_CTX_check_private_key(ctx) != 1) {
		ssl_error("keyfile does not match certfile:", *keyfile ? keyfile : certfile);
		goto fail;
	}
	if (*ciphers && SSL_CTX_set_cipher_list(ctx, ciphers) != 1) {
		ssl_error("ciphers", ciphers);
		goto fail;
	}
	if (*ca) {
		STACK_OF(X509_NAME) *names_ca = SSL_load_client_CA_file(ca);

		if (SSL_CTX_load_verify_locations(ctx, ca, NULL) != 1 || !names_ca) {
			sk_X509_NAME_pop_free(names_ca, X509_NAME_free);
			ssl_error("ca_certs", ca);
			goto fail;
		}
		SSL_CTX_set_client_CA_list(ctx, names_ca);
	}
	else if (mode != SSL_VERIFY_NONE) {
		PyErr_SetString(PyExc_ValueError, "cert_reqs optional or required needs ca_certs");
		goto fail;
	}
	SSL_CTX_set_verify(ctx, mode, NULL);
	chain_once(ctx);
	SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
	/* resumption: the server's session cache (TLS 1.2 ids) and tickets
	 * (on by default); the id context is what a resumed session must
	 * match, needed whenever client certificates are asked for */
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
	SSL_CTX_set_session_id_context(ctx, (const unsigned char *)"sockherd", 8);
	/* one TLS 1.3 ticket after a full handshake, not OpenSSL's two: each
	 * costs an i2d, a d2i and an i2d of the session again, a key
	 * derivation, AES-CBC and an HMAC (measured: 1.8 % of a full RSA
	 * handshake's instructions for the second one). A client resumes with
	 * it, and every resumed handshake gives it the next (OpenSSL sends one
	 * after a resumption whatever this says), so a chain of reconnections
	 * resumes on; what it loses is a second connection opened in
	 * parallel resuming too, which Go's crypto/tls server does not offer
	 * either (one ticket) */
	SSL_CTX_set_num_tickets(ctx, 1);
	/* the master's ticket keys, the same in all its workers: a ticket one
	 * worker issued resumes on any other (by default each context makes
	 * keys of its own, and a client's next connection, which the kernel
	 * may give another worker, fell back to a full handshake) */
	if (tickets != Py_None &&
	    SSL_CTX_set_tlsext_ticket_keys(ctx, PyBytes_AS_STRING(tickets), 80) != 1) {
		ssl_error("ticket_keys", NULL);
		goto fail;
	}
	pem = pem_str(SSL_CTX_get0_certificate(ctx));
	if (!pem)
		goto fail;
	ERR_clear_error();
	SSL_CTX_free(s->tls_ctx);
	s->tls_ctx = ctx;
	s->tls = &tls_ops;
	Py_XSETREF(s->tls_server_pem, pem);
	Py_RETURN_NONE;
fail:
	SSL_CTX_free(ctx);
	return NULL;
}

static PyObject *get_tls(Server *s, PyObject *noarg)
{
	(void)noarg;
	return Py_BuildValue("{sOsKsKsKsKsK}", "on", s->tls_ctx ? Py_True : Py_False,
	                     "handshakes", s->tls_handshakes, "resumed", s->tls_resumed,
	                     "handshake_failed", s->tls_failed, "handshake_abandoned",
	                     s->tls_abandoned, "plain_refused", s->tls_plain);
}

PyMethodDef server_tls_methods[] = {
	{"set_tls", (PyCFunction)(void (*)(void))Server_set_tls, METH_VARARGS | METH_KEYWORDS,
	 "set_tls(certfile, keyfile='', password=None, ca_certs='', cert_reqs='none', ciphers='', "
	 "min_version='TLSv1.2', ticket_keys=None): every connection accepted from now on speaks TLS. Raises "
	 "ValueError naming the file that does not load. Before the first accept."},
	{"tls_counts", (PyCFunction)get_tls, METH_NOARGS,
	 "tls_counts() -> {on, handshakes, resumed, handshake_failed, handshake_abandoned, "
	 "plain_refused}: handshakes completed (resumed: of them, a session resumed)"},
	{NULL},
};
