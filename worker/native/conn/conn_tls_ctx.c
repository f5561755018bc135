/* The TLS context of a Server (Server.set_tls, Server.tls_counts): one
 * SSL_CTX per worker, built from the settings at start, so a reload, which
 * starts new workers, reads the certificate and key again. Connections
 * speak TLS through it in conn_tls.c.
 */
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "server.h"
#include "conn_tls.h"
#include "conn_tls_int.h"

/* ---- the context: Server.set_tls ---------------------------------------------------------------- */

/* what we speak, in our order of preference: http/1.0 too, as nginx
 * selects it (NGX_HTTP_ALPN_PROTOS); `curl --http1.0` offers it alone */
static const unsigned char ALPN_H1[] = "\x08http/1.1\x08http/1.0";

/* ALPN: http/1.1 when offered, else http/1.0 (h2 would be chosen here
 * once a codec exists). A client that offers ALPN without either is
 * refused with the no_application_protocol alert (RFC 7301 §3.2; nginx
 * refuses it too): serving it HTTP/1.x would speak a protocol it did not
 * offer. A client that sends no ALPN extension never reaches this
 * callback and is served HTTP/1.1 (issue 35 §22; its review: an offer of
 * http/1.0 alone was refused). */
static int alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                       const unsigned char *in, unsigned int inlen, void *arg)
{
	(void)ssl;
	(void)arg;
	if (SSL_select_next_proto((unsigned char **)out, outlen, ALPN_H1, sizeof(ALPN_H1) - 1, in,
	                          inlen) == OPENSSL_NPN_NEGOTIATED)
		return SSL_TLSEXT_ERR_OK;
	return SSL_TLSEXT_ERR_ALERT_FATAL;          /* OpenSSL sends no_application_protocol */
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

/* ---- the policy digest: what a resumed session must have been made under ---------------------- */

static int digest_bytes(EVP_MD_CTX *md, const void *p, size_t n)
{
	unsigned char len[8];
	int i;

	for (i = 0; i < 8; i++)             /* length-prefixed: no two inputs hash alike */
		len[i] = (unsigned char)((unsigned long long)n >> (8 * i));
	return EVP_DigestUpdate(md, len, 8) == 1 && EVP_DigestUpdate(md, p, n) == 1 ? 0 : -1;
}

static int digest_x509(EVP_MD_CTX *md, X509 *x)
{
	unsigned char h[EVP_MAX_MD_SIZE];
	unsigned int n = 0;

	return x && X509_digest(x, EVP_sha256(), h, &n) == 1 ? digest_bytes(md, h, n) : -1;
}

/* SHA-256 over what decides who a handshake lets in and what it proves:
 * the certificate chain served, the client-CA names sent, every
 * certificate and CRL the client's is verified against, the verify mode
 * and depth, the versions and ciphers allowed. It is the session id
 * context (a session made under another is a cache miss, OpenSSL's
 * ssl_get_prev_session: so a full handshake, under the policy of now)
 * and what the ticket keys are derived from (conn_tls_tickets.c), as
 * nginx hashes its certificates and client CAs into its context. 0, or
 * -1 (OpenSSL failed). */
static int policy_digest(SSL_CTX *ctx, const char *ciphers, unsigned char out[32])
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	STACK_OF(X509) *chain = NULL;
	STACK_OF(X509_NAME) *names = SSL_CTX_get_client_CA_list(ctx);
	STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx));
	long nums[3] = {SSL_CTX_get_verify_mode(ctx), SSL_CTX_get_verify_depth(ctx),
	                SSL_CTX_get_min_proto_version(ctx)};
	unsigned int n = 0;
	int i, r = -1;

	if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 ||
	    digest_bytes(md, "sockherd TLS policy 1", 21) < 0 || digest_bytes(md, nums, sizeof(nums)) < 0 ||
	    digest_bytes(md, ciphers, strlen(ciphers)) < 0 ||
	    digest_x509(md, SSL_CTX_get0_certificate(ctx)) < 0)
		goto done;
	SSL_CTX_get0_chain_certs(ctx, &chain);
	for (i = 0; i < sk_X509_num(chain); i++)
		if (digest_x509(md, sk_X509_value(chain, i)) < 0)
			goto done;
	for (i = 0; i < sk_X509_NAME_num(names); i++) {
		unsigned char h[EVP_MAX_MD_SIZE];

		if (X509_NAME_digest(sk_X509_NAME_value(names, i), EVP_sha256(), h, &n) != 1 ||
		    digest_bytes(md, h, n) < 0)
			goto done;
	}
	for (i = 0; i < sk_X509_OBJECT_num(objs); i++) {
		X509_OBJECT *o = sk_X509_OBJECT_value(objs, i);
		X509_CRL *crl = X509_OBJECT_get0_X509_CRL(o);
		unsigned char h[EVP_MAX_MD_SIZE];

		if (X509_OBJECT_get0_X509(o)) {
			if (digest_x509(md, X509_OBJECT_get0_X509(o)) < 0)
				goto done;
		}
		else if (crl && (X509_CRL_digest(crl, EVP_sha256(), h, &n) != 1 ||
		                 digest_bytes(md, h, n) < 0))
			goto done;
	}
	r = EVP_DigestFinal_ex(md, out, &n) == 1 && n == 32 ? 0 : -1;
done:
	EVP_MD_CTX_free(md);
	return r;
}

static PyObject *Server_set_tls(Server *s, PyObject *args, PyObject *kw)
{
	static char *names[] = {"certfile", "keyfile", "password", "ca_certs", "cert_reqs", "ciphers",
	                        "min_version", "ticket_secret", "ticket_epoch", "ticket_rotation",
	                        "cert_pem", "key_pem", "ca_pem", NULL};
	const char *certfile, *keyfile = "", *ca = "", *reqs = "none", *ciphers = "",
	           *minv = "TLSv1.2";
	PyObject *password = Py_None, *tickets = Py_None, *pem = NULL;
	/* the files' bytes as the master read them (conn_tls_load.c) */
	PyObject *cert_pem = Py_None, *key_pem = Py_None, *ca_pem = Py_None;
	SSL_CTX *ctx;
	int mode, version;
	long long epoch = 0, rotation = 3600;
	unsigned char policy[32];

	if (!PyArg_ParseTupleAndKeywords(args, kw, "s|sOssssOLLOOO:set_tls", names, &certfile,
	                                 &keyfile, &password, &ca, &reqs, &ciphers, &minv, &tickets,
	                                 &epoch, &rotation, &cert_pem, &key_pem, &ca_pem))
		return NULL;
	if ((cert_pem != Py_None && !PyBytes_Check(cert_pem)) ||
	    (key_pem != Py_None && !PyBytes_Check(key_pem)) ||
	    (ca_pem != Py_None && !PyBytes_Check(ca_pem))) {
		PyErr_SetString(PyExc_TypeError, "set_tls: cert_pem, key_pem, ca_pem: bytes or None");
		return NULL;
	}
	if (password != Py_None && !PyBytes_Check(password)) {
		PyErr_SetString(PyExc_TypeError, "set_tls: password must be bytes or None");
		return NULL;
	}
	/* the master's ticket secret of epoch (conn_tls_tickets.c) */
	if (tickets != Py_None && (!PyBytes_Check(tickets) || PyBytes_GET_SIZE(tickets) != 32)) {
		PyErr_SetString(PyExc_ValueError, "set_tls: ticket_secret must be 32 bytes or None");
		return NULL;
	}
	if (rotation < 1) {
		PyErr_Format(PyExc_ValueError, "set_tls: ticket_rotation %lld: at least 1 second",
		             rotation);
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
		return tls_error("an SSL context", NULL);
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
	if (tls_load_cert(ctx, certfile, cert_pem != Py_None ? cert_pem : NULL) < 0 ||
	    tls_load_key(ctx, *keyfile ? keyfile : certfile, key_pem != Py_None ? key_pem : NULL) < 0)
		goto fail;
	/* the password is needed no more: never kept past this call */
	SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
	if (SSL_CTX_check_private_key(ctx) != 1) {
		tls_error("keyfile does not match certfile:", *keyfile ? keyfile : certfile);
		goto fail;
	}
	if (*ciphers && SSL_CTX_set_cipher_list(ctx, ciphers) != 1) {
		tls_error("ciphers", ciphers);
		goto fail;
	}
	if (*ca) {
		if (tls_load_ca(ctx, ca, ca_pem != Py_None ? ca_pem : NULL) < 0)
			goto fail;
	}
	else if (mode != SSL_VERIFY_NONE) {
		PyErr_SetString(PyExc_ValueError, "cert_reqs optional or required needs ca_certs");
		goto fail;
	}
	SSL_CTX_set_verify(ctx, mode, NULL);
	chain_once(ctx);
	SSL_CTX_set_alpn_select_cb(ctx, alpn_select, NULL);
	/* resumption: the server's session cache (TLS 1.2 ids) and tickets;
	 * the id context is what a resumed session must match: the policy's
	 * digest, not a fixed string, so a session made before a reload that
	 * asks for client certificates (or trusts other CAs) is not resumed
	 * after it (issue 35 §14) */
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
	if (policy_digest(ctx, ciphers, policy) < 0 ||
	    SSL_CTX_set_session_id_context(ctx, policy, sizeof(policy)) != 1) {
		tls_error("the TLS policy's digest", NULL);
		goto fail;
	}
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
	/* ticket keys from the master's secret, the same in all its workers:
	 * a ticket one worker issued resumes on any other (by default each
	 * context makes keys of its own, and a client's next connection, which
	 * the kernel may give another worker, fell back to a full handshake);
	 * derived from the policy too and rotated (conn_tls_tickets.c) */
	if (tickets_install(ctx,
	                    tickets != Py_None ? (unsigned char *)PyBytes_AS_STRING(tickets) : NULL,
	                    epoch, rotation, policy) < 0) {
		tls_error("session-ticket keys", NULL);
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
	 "min_version='TLSv1.2', ticket_secret=None, ticket_epoch=0, ticket_rotation=3600, cert_pem=None, key_pem=None, "
	 "ca_pem=None): every connection accepted from now on speaks TLS. Raises "
	 "ValueError naming the file that does not load. Before the first accept."},
	{"tls_counts", (PyCFunction)get_tls, METH_NOARGS,
	 "tls_counts() -> {on, handshakes, resumed, handshake_failed, handshake_abandoned, "
	 "plain_refused}: handshakes completed (resumed: of them, a session resumed)"},
	{NULL},
};
