/* The files of a TLS context (Server.set_tls): the certificate chain, the
 * key and the client CAs, each from the bytes the master read or else
 * from its file (issue 35 §26).
 *
 * A worker switches to `--user` before it builds its context
 * (worker/identity.py), so a key readable by root alone (mode 0600, the
 * usual /etc/ssl/private) could not be opened by it: the start failed
 * with OpenSSL's "system lib". The master, which keeps its identity,
 * reads the files when it spawns a worker (master/tls.py) and sends
 * their bytes in the assignment, as nginx reads its keys before it drops
 * privileges; the paths stay for the messages. A Server used on its own
 * (the tests' engine) reads the files itself, and an error then says
 * which file and why (the errno's text, not "system lib").
 */
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include "conn_tls_int.h"

PyObject *tls_error(const char *what, const char *path)
{
	unsigned long e, last = 0, sys = 0;
	const char *why = NULL;

	/* the queue, oldest first: a failed fopen or read puts its errno
	 * first (a system error), then the libraries' "system lib" on top of
	 * it; the errno's text says why, the top alone does not */
	while ((e = ERR_get_error())) {
		if (ERR_SYSTEM_ERROR(e) && !sys)
			sys = e;
		last = e;
	}
	if (sys)
		why = strerror(ERR_GET_REASON(sys));
	else if (last)
		why = ERR_reason_error_string(last);
	PyErr_Format(PyExc_ValueError, "%s %s: %s", what, path ? path : "", why ? why : "failed");
	return NULL;
}

static BIO *mem(PyObject *pem)
{
	return BIO_new_mem_buf(PyBytes_AS_STRING(pem), (int)PyBytes_GET_SIZE(pem));
}

/* The leaf then the chain after it, as SSL_CTX_use_certificate_chain_file
 * reads a file. */
int tls_load_cert(SSL_CTX *ctx, const char *path, PyObject *pem)
{
	BIO *b;
	X509 *x;
	int ok;

	if (!pem)
		return SSL_CTX_use_certificate_chain_file(ctx, path) == 1 ? 0
		       : (tls_error("certfile", path), -1);
	b = mem(pem);
	x = b ? PEM_read_bio_X509_AUX(b, NULL, NULL, NULL) : NULL;
	ok = x && SSL_CTX_use_certificate(ctx, x) == 1 && SSL_CTX_clear_chain_certs(ctx) == 1;
	X509_free(x);
	while (ok && (x = PEM_read_bio_X509(b, NULL, NULL, NULL)))
		if (SSL_CTX_add0_chain_cert(ctx, x) != 1) {
			X509_free(x);
			ok = 0;
		}
	BIO_free(b);
	if (ok && ERR_GET_REASON(ERR_peek_last_error()) == PEM_R_NO_START_LINE)
		ERR_clear_error();                  /* the end of the chain */
	if (!ok || ERR_peek_error()) {
		tls_error("certfile", path);
		return -1;
	}
	return 0;
}

int tls_load_key(SSL_CTX *ctx, const char *path, PyObject *pem)
{
	BIO *b;
	EVP_PKEY *k;
	int ok;

	if (!pem)
		return SSL_CTX_use_PrivateKey_file(ctx, path, SSL_FILETYPE_PEM) == 1 ? 0
		       : (tls_error("keyfile", path), -1);
	b = mem(pem);
	k = b ? PEM_read_bio_PrivateKey(b, NULL, SSL_CTX_get_default_passwd_cb(ctx),
	                                SSL_CTX_get_default_passwd_cb_userdata(ctx))
	      : NULL;
	ok = k && SSL_CTX_use_PrivateKey(ctx, k) == 1;
	EVP_PKEY_free(k);
	BIO_free(b);
	if (!ok) {
		tls_error("keyfile", path);
		return -1;
	}
	return 0;
}

/* The certificates (and CRLs) client certificates are verified against,
 * and the CA names sent to the client. */
int tls_load_ca(SSL_CTX *ctx, const char *path, PyObject *pem)
{
	STACK_OF(X509_NAME) *names;
	STACK_OF(X509_INFO) *infos;
	X509_STORE *store = SSL_CTX_get_cert_store(ctx);
	BIO *b;
	int i, n = 0, ok = 1;

	if (!pem) {
		names = SSL_load_client_CA_file(path);
		if (SSL_CTX_load_verify_locations(ctx, path, NULL) != 1 || !names) {
			sk_X509_NAME_pop_free(names, X509_NAME_free);
			tls_error("ca_certs", path);
			return -1;
		}
		SSL_CTX_set_client_CA_list(ctx, names);
		return 0;
	}
	b = mem(pem);
	infos = b ? PEM_X509_INFO_read_bio(b, NULL, NULL, NULL) : NULL;
	BIO_free(b);
	for (i = 0; ok && i < sk_X509_INFO_num(infos); i++) {
		X509_INFO *info = sk_X509_INFO_value(infos, i);

		if (info->x509) {
			ok = X509_STORE_add_cert(store, info->x509) == 1 &&
			     SSL_CTX_add_client_CA(ctx, info->x509) == 1;
			n++;
		}
		if (ok && info->crl)
			ok = X509_STORE_add_crl(store, info->crl) == 1;
	}
	sk_X509_INFO_pop_free(infos, X509_INFO_free);
	if (!infos || !ok || !n) {
		if (!n && !ERR_peek_error())
			PyErr_Format(PyExc_ValueError, "ca_certs %s: no certificate in it", path);
		else
			tls_error("ca_certs", path);
		return -1;
	}
	return 0;
}
