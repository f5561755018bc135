/* The WSGI adapter's part of the trusted proxy headers (forwarded.h): what
 * a trusted request's forwarding fields said (fwd_read) put in its
 * environ, after the connection's own addresses (wsgi_app.c's set_addr):
 *
 *   REMOTE_ADDR, REMOTE_PORT ("0": a proxy rarely says the port),
 *   wsgi.url_scheme and HTTPS (on for https, removed for http),
 *   HTTP_HOST + SERVER_NAME + SERVER_PORT (the host's port, else the
 *   request's scheme's: the proxy's, else the connection's), SERVER_PORT (X-Forwarded-Port),
 *   SCRIPT_NAME (the prefix before root_path's)
 *
 * The raw fields stay in the environ as they came (HTTP_X_FORWARDED_FOR).
 *
 * May call: the codec (fwd_fields.c).
 */
#include <string.h>

#include "wsgi.h"

static PyObject *K_URL_SCHEME, *K_HTTPS, *K_HOST, *K_SCRIPT, *V_HTTPS, *V_HTTP, *V_ON;

int wsgi_fwd_make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_URL_SCHEME, "wsgi.url_scheme"}, {&K_HTTPS, "HTTPS"}, {&K_HOST, "HTTP_HOST"},
		{&K_SCRIPT, "SCRIPT_NAME"}, {&V_HTTPS, "https"}, {&V_HTTP, "http"}, {&V_ON, "on"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return 0;
}

static int put(PyObject *d, PyObject *key, PyObject *v)
{
	int rc = v ? PyDict_SetItem(d, key, v) : -1;

	Py_XDECREF(v);
	return rc;
}

/* HTTP_HOST, SERVER_NAME, SERVER_PORT of a host[:port] (checked); a host
 * without a port has the request's scheme's (https: 1) */
static int put_host(PyObject *env, const struct fwd_found *f, int https)
{
	const char *colon = NULL;

	/* the port follows the last ':' outside an IPv6 literal */
	for (size_t i = f->host_len; i-- > 0 && f->host[i] != ']';)
		if (f->host[i] == ':') {
			colon = f->host + i;
			break;
		}
	if (put(env, K_HOST, PyUnicode_DecodeLatin1(f->host, (Py_ssize_t)f->host_len, NULL)) < 0 ||
	    put(env, K_SERVER_NAME, PyUnicode_DecodeLatin1(f->host, colon ? colon - f->host
	                                                    : (Py_ssize_t)f->host_len, NULL)) < 0)
		return -1;
	return put(env, K_SERVER_PORT,
	           colon ? PyUnicode_DecodeLatin1(colon + 1, f->host + f->host_len - colon - 1, NULL)
	                 : PyUnicode_FromString(https ? "443" : "80"));
}

/* env without key (there or not) */
static int drop(PyObject *env, PyObject *key)
{
	int has = PyDict_Contains(env, key);

	return has > 0 ? PyDict_DelItem(env, key) : has;
}

int fwd_environ(struct conn *c, PyObject *env)
{
	struct fwd_found f;
	int rc = fwd_read(c, &f), https;

	if (rc <= 0)
		return rc;
	if (f.family && (put(env, K_REMOTE_ADDR, fwd_addr_str(&f)) < 0 ||
	                 put(env, K_REMOTE_PORT, PyUnicode_FromFormat("%d", f.port)) < 0))
		return -1;
	/* the request's scheme: the proxy's word, else the connection's (TLS
	 * put HTTPS=on before, wsgi_app.c); HTTPS is there exactly when it is
	 * https, as an app reading HTTPS rather than wsgi.url_scheme is told
	 * the same (a proxy's "http" over TLS left it "on": issue 35 §20) */
	https = f.https >= 0 ? f.https : c->ssl != NULL;
	if (f.https >= 0) {
		if (PyDict_SetItem(env, K_URL_SCHEME, f.https ? V_HTTPS : V_HTTP) < 0)
			return -1;
		if (f.https ? PyDict_SetItem(env, K_HTTPS, V_ON) < 0 : drop(env, K_HTTPS) < 0)
			return -1;
	}
	if (f.host && put_host(env, &f, https) < 0)
		return -1;
	if (f.server_port > 0 &&
	    put(env, K_SERVER_PORT, PyUnicode_FromFormat("%d", f.server_port)) < 0)
		return -1;
	if (f.prefix_len && fwd_prepend(env, K_SCRIPT, &f) < 0)
		return -1;
	return 0;
}
