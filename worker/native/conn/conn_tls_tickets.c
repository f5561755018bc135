/* The session-ticket keys of a TLS context (issue 35 §14, §28): derived
 * from the TLS policy and rotated.
 *
 * The master makes one random 32-byte secret (master/tls.py) and hands it
 * to every worker with the epoch it belongs to; an epoch is
 * CLOCK_MONOTONIC's seconds divided by ssl_ticket_key_rotation, a clock
 * every process of the host reads alike, so all workers agree on which
 * epoch it is without a message. Each epoch's secret is the one before it
 * run through HMAC-SHA256 (a one-way ratchet): a process that moved on
 * forgets the old secret, and from the ones it holds the older keys
 * cannot be worked out (the forward secrecy a fixed key lacks). The
 * ticket keys of an epoch (a 16-byte name, an AES-256 key and an HMAC
 * key) are derived from its secret and the context's policy digest
 * (conn_tls_ctx.c): two policies, two sets of keys, so a ticket issued
 * under one never decrypts under another (a reload that changes the
 * client-certificate policy makes every older ticket a full handshake).
 *
 * Tickets are issued with the current epoch's keys; the previous epoch's
 * still decrypt (and the client gets a new ticket: return 2), so a
 * ticket lives between one and two rotations. One mutex per context: its
 * loop threads share it, and the advance writes what the others read.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>

#include "conn_tls_int.h"

struct keyset {
	unsigned char name[16], aes[32], mac[32];
};

struct tickets {
	pthread_mutex_t lock;
	unsigned char policy[32];
	unsigned char secret[32];           /* the current epoch's */
	long long epoch;                    /* the current one */
	long long rotation;                 /* seconds */
	struct keyset cur, prev;
	int have_prev;
};

static int tk_index = -1;

/* HMAC-SHA256(key, label || data): 0, or -1 (OpenSSL failed) */
static int mac(const unsigned char key[32], const char *label, const unsigned char *data,
               size_t n, unsigned char out[32])
{
	unsigned char msg[64];
	size_t k = strlen(label);
	unsigned int len = 32;

	if (k + n > sizeof(msg))
		return -1;
	memcpy(msg, label, k);
	if (n)                              /* data may be NULL when n is 0: memcpy's UB */
		memcpy(msg + k, data, n);
	return HMAC(EVP_sha256(), key, 32, msg, k + n, out, &len) ? 0 : -1;
}

static int derive(struct keyset *ks, const unsigned char secret[32],
                  const unsigned char policy[32])
{
	unsigned char k[32], name[32];
	int r = mac(secret, "policy", policy, 32, k) | mac(k, "name", NULL, 0, name) |
	        mac(k, "aes", NULL, 0, ks->aes) | mac(k, "mac", NULL, 0, ks->mac);

	memcpy(ks->name, name, 16);
	OPENSSL_cleanse(k, sizeof(k));
	return r;
}

/* the next epoch's secret over this one (master/tls.py's ratchet too) */
static int ratchet(unsigned char secret[32])
{
	unsigned char next[32];
	int r = mac(secret, "next", NULL, 0, next);

	memcpy(secret, next, 32);
	OPENSSL_cleanse(next, sizeof(next));
	return r;
}

static long long epoch_now(long long rotation)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec / rotation;
}

/* Moves t to epoch now: the secrets of the epochs skipped (an idle
 * worker) are ratcheted through, the one before now kept as prev. */
static int advance(struct tickets *t, long long now)
{
	if (now <= t->epoch)
		return 0;
	while (t->epoch < now - 1) {
		if (ratchet(t->secret) < 0)
			return -1;
		t->epoch++;
	}
	if (derive(&t->prev, t->secret, t->policy) < 0 || ratchet(t->secret) < 0 ||
	    derive(&t->cur, t->secret, t->policy) < 0)
		return -1;
	t->have_prev = 1;
	t->epoch = now;
	return 0;
}

static int ticket_cb(SSL *ssl, unsigned char *name, unsigned char *iv, EVP_CIPHER_CTX *cctx,
                     EVP_MAC_CTX *hctx, int enc)
{
	struct tickets *t = SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), tk_index);
	struct keyset ks;
	OSSL_PARAM params[3];
	int r = 0;

	if (!t)
		return -1;
	pthread_mutex_lock(&t->lock);
	if (advance(t, epoch_now(t->rotation)) < 0)
		r = -1;
	else if (enc || !memcmp(name, t->cur.name, 16))
		/* TLS 1.3: 2 (renew), or OpenSSL sends no ticket after a
		 * resumption and the client's chain of reconnections ends (it
		 * sent one with its own keys, OpenSSL's default path) */
		ks = t->cur, r = enc || SSL_version(ssl) != TLS1_3_VERSION ? 1 : 2;
	else if (t->have_prev && !memcmp(name, t->prev.name, 16))
		ks = t->prev, r = 2;               /* decrypts; the client gets a new ticket */
	pthread_mutex_unlock(&t->lock);
	if (r <= 0)
		return r;                          /* 0: not ours (any more): a full handshake */
	if (enc) {
		memcpy(name, ks.name, 16);
		if (RAND_bytes(iv, 16) != 1)
			r = -1;
	}
	params[0] = OSSL_PARAM_construct_octet_string(OSSL_MAC_PARAM_KEY, ks.mac, 32);
	params[1] = OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0);
	params[2] = OSSL_PARAM_construct_end();
	if (r > 0 && (EVP_CipherInit_ex(cctx, EVP_aes_256_cbc(), NULL, ks.aes, iv, enc) != 1 ||
	              EVP_MAC_CTX_set_params(hctx, params) != 1))
		r = -1;
	OPENSSL_cleanse(&ks, sizeof(ks));
	return r;
}

static void tickets_free(void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx, long argl,
                         void *argp)
{
	struct tickets *t = ptr;

	(void)parent, (void)ad, (void)idx, (void)argl, (void)argp;
	if (!t)
		return;
	pthread_mutex_destroy(&t->lock);
	OPENSSL_clear_free(t, sizeof(*t));
}

int tickets_install(SSL_CTX *ctx, const unsigned char *secret, long long epoch,
                    long long rotation, const unsigned char policy[32])
{
	struct tickets *t;

	if (rotation < 1)
		return -1;
	if (tk_index < 0) {
		tk_index = SSL_CTX_get_ex_new_index(0, NULL, NULL, NULL, tickets_free);
		if (tk_index < 0)
			return -1;
	}
	t = OPENSSL_zalloc(sizeof(*t));
	if (!t)
		return -1;
	pthread_mutex_init(&t->lock, NULL);
	memcpy(t->policy, policy, 32);
	t->rotation = rotation;
	/* no master (a Server used on its own): a secret of this context's */
	if (secret)
		memcpy(t->secret, secret, 32), t->epoch = epoch;
	else if (RAND_bytes(t->secret, 32) != 1)
		goto fail;
	else
		t->epoch = epoch_now(rotation);
	if (derive(&t->cur, t->secret, t->policy) < 0 || advance(t, epoch_now(rotation)) < 0 ||
	    !SSL_CTX_set_ex_data(ctx, tk_index, t))
		goto fail;
	SSL_CTX_set_tlsext_ticket_key_evp_cb(ctx, ticket_cb);
	return 0;
fail:
	tickets_free(NULL, t, NULL, 0, 0, NULL);
	return -1;
}
