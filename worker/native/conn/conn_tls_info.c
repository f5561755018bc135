/* What a connection's TLS session says (the connection layer's TLS step,
 * conn_tls.c, holds the session), in no interface's names: the facts the
 * adapters show as theirs (app/wsgi/wsgi_tls.c: the environ's SSL_* keys,
 * app/asgi/asgi_tls.c: the "tls" extension), and a certificate as PEM for
 * the context's server_cert (conn_tls_ctx.c). OpenSSL's error queue is
 * left empty after every call here. Callers: the connection's loop
 * thread, GIL held, c->ssl set.
 */
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "server.h"
#include "conn_tls.h"
#include "conn_tls_int.h"

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
PyObject *pem_str(X509 *x) { return bio_text(fill_pem, x); }

static PyObject *serial_str(X509 *x)
{
	BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL);
	char *hex = bn ? BN_bn2hex(bn) : NULL;
	PyObject *v = hex ? PyUnicode_FromString(hex) : PyErr_NoMemory();

	OPENSSL_free(hex);
	BN_free(bn);
	return v;
}

void tls_facts(struct conn *c, struct tls_facts *f)
{
	f->protocol = SSL_get_version(c->ssl);
	f->cipher = SSL_get_cipher_name(c->ssl);
	f->resumed = SSL_session_reused(c->ssl);
	f->sni = SSL_get_servername(c->ssl, TLSEXT_NAMETYPE_host_name);
	f->version = SSL_version(c->ssl);
	f->cipher_id = SSL_CIPHER_get_protocol_id(SSL_get_current_cipher(c->ssl));
}

int tls_peer(struct conn *c, struct tls_peer *p)
{
	X509 *peer = SSL_get1_peer_certificate(c->ssl);
	int rc;

	p->subject = p->issuer = p->serial = p->pem = NULL;
	if (!peer)
		return 0;
	rc = !(p->subject = name_str(X509_get_subject_name(peer))) ||
	     !(p->issuer = name_str(X509_get_issuer_name(peer))) ||
	     !(p->serial = serial_str(peer)) || !(p->pem = pem_str(peer));
	X509_free(peer);
	ERR_clear_error();
	if (rc) {
		tls_peer_clear(p);
		return -1;
	}
	return 1;
}

PyObject *tls_peer_subject(struct conn *c, int *has_peer)
{
	X509 *peer = SSL_get1_peer_certificate(c->ssl);
	PyObject *v;

	*has_peer = peer != NULL;
	if (!peer)
		Py_RETURN_NONE;
	v = name_str(X509_get_subject_name(peer));
	X509_free(peer);
	ERR_clear_error();
	return v;
}

void tls_peer_clear(struct tls_peer *p)
{
	Py_CLEAR(p->subject);
	Py_CLEAR(p->issuer);
	Py_CLEAR(p->serial);
	Py_CLEAR(p->pem);
}

PyObject *tls_verify_text(struct conn *c, int has_peer)
{
	long rc = SSL_get_verify_result(c->ssl);

	if (!has_peer)
		return PyUnicode_FromString("NONE");
	if (rc == X509_V_OK)
		return PyUnicode_FromString("SUCCESS");
	return PyUnicode_FromFormat("FAILED:%s", X509_verify_cert_error_string(rc));
}

PyObject *tls_verify_error(struct conn *c, int has_peer)
{
	long vr = SSL_get_verify_result(c->ssl);

	if (has_peer && vr != X509_V_OK)
		return PyUnicode_FromString(X509_verify_cert_error_string(vr));
	Py_RETURN_NONE;
}

PyObject *tls_peer_chain(struct conn *c)
{
	STACK_OF(X509) *chain = SSL_get_peer_cert_chain(c->ssl);
	X509 *peer = SSL_get1_peer_certificate(c->ssl);
	PyObject *list = PyList_New(0), *v;
	int rc = !list;

	/* the client's certificate first, then its chain (a server's chain
	 * leaves the peer's own out of SSL_get_peer_cert_chain) */
	if (!rc && peer) {
		v = pem_str(peer);
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
	X509_free(peer);
	ERR_clear_error();
	if (rc) {
		Py_XDECREF(list);
		return NULL;
	}
	return list;
}
