/* What a trusted request's forwarding fields said (fwd_read,
 * forwarded.c), put where each adapter's app looks:
 *
 *   WSGI  REMOTE_ADDR, REMOTE_PORT ("0": a proxy rarely says the port),
 *         wsgi.url_scheme and HTTPS=on, HTTP_HOST + SERVER_NAME +
 *         SERVER_PORT (the host's port, else the scheme's), SERVER_PORT
 *         (X-Forwarded-Port), SCRIPT_NAME (the prefix before root_path)
 *   ASGI  client (host, port), scheme, root_path and path (the prefix
 *         before each: path is the whole path the client asked for)
 *
 * The raw fields stay in the environ / headers as they came.
 *
 * May call: forwarded.c; the adapters' interned keys (wsgi.h).
 */
#include <arpa/inet.h>
#include <string.h>

#include "forwarded.h"
#include "wsgi.h"

static PyObject *K_URL_SCHEME, *K_HTTPS, *K_HTTP_HOST, *K_SCRIPT, *V_HTTPS, *V_HTTP, *V_ON,
                *K_CLIENT, *K_SCHEME, *K_ROOT_PATH, *K_PATH;

int fwd_make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_URL_SCHEME, "wsgi.url_scheme"}, {&K_HTTPS, "HTTPS"}, {&K_HTTP_HOST, "HTTP_HOST"},
		{&K_SCRIPT, "SCRIPT_NAME"}, {&V_HTTPS, "https"}, {&V_HTTP, "http"}, {&V_ON, "on"},
		{&K_CLIENT, "client"}, {&K_SCHEME, "scheme"}, {&K_ROOT_PATH, "root_path"},
		{&K_PATH, "path"},
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

static PyObject *addr_str(const struct fwd_found *f)
{
	char buf[INET6_ADDRSTRLEN];

	if (!inet_ntop(f->family, f->addr, buf, sizeof(buf))) {
		PyErr_SetFromErrno(PyExc_OSError);
		return NULL;
	}
	return PyUnicode_FromString(buf);
}

/* prefix + the str at d[key] (missing: "") */
static int prepend(PyObject *d, PyObject *key, const struct fwd_found *f)
{
	PyObject *old = PyDict_GetItemWithError(d, key), *pre;    /* borrowed */

	if (!old && PyErr_Occurred())
		return -1;
	pre = PyUnicode_DecodeLatin1(f->prefix, (Py_ssize_t)f->prefix_len, NULL);
	if (!pre)
		return -1;
	if (old && PyUnicode_Check(old))
		Py_SETREF(pre, PyUnicode_Concat(pre, old));
	return put(d, key, pre);
}

int fwd_environ(HttpConn *c, PyObject *env)
{
	struct fwd_found f;
	int rc = fwd_read(c, &f);

	if (rc <= 0)
		return rc;
	if (f.family && (put(env, K_REMOTE_ADDR, addr_str(&f)) < 0 ||
	                 put(env, K_REMOTE_PORT, PyUnicode_FromFormat("%d", f.port)) < 0))
		return -1;
	if (f.https >= 0) {
		if (PyDict_SetItem(env, K_URL_SCHEME, f.https ? V_HTTPS : V_HTTP) < 0)
			return -1;
		if (f.https && PyDict_SetItem(env, K_HTTPS, V_ON) < 0)
			return -1;
	}
	if (f.host) {
		const char *colon = NULL;

		/* the port follows the last ':' outside an IPv6 literal */
		for (size_t i = f.host_len; i-- > 0 && f.host[i] != ']';)
			if (f.host[i] == ':') {
				colon = f.host + i;
				break;
			}
		if (put(env, K_HTTP_HOST, PyUnicode_DecodeLatin1(f.host, (Py_ssize_t)f.host_len, NULL)) < 0 ||
		    put(env, K_SERVER_NAME,
		        PyUnicode_DecodeLatin1(f.host, colon ? colon - f.host : (Py_ssize_t)f.host_len,
		                               NULL)) < 0 ||
		    put(env, K_SERVER_PORT,
		        colon ? PyUnicode_DecodeLatin1(colon + 1, f.host + f.host_len - colon - 1, NULL)
		              : PyUnicode_FromString(f.https > 0 ? "443" : "80")) < 0)
			return -1;
	}
	if (f.server_port > 0 &&
	    put(env, K_SERVER_PORT, PyUnicode_FromFormat("%d", f.server_port)) < 0)
		return -1;
	if (f.prefix_len && prepend(env, K_SCRIPT, &f) < 0)
		return -1;
	return 0;
}

int fwd_scope(HttpConn *c, PyObject *scope)
{
	struct fwd_found f;
	int rc = fwd_read(c, &f);

	if (rc <= 0)
		return rc;
	if (f.family) {
		PyObject *host = addr_str(&f);

		if (!host || put(scope, K_CLIENT, Py_BuildValue("(Ni)", host, f.port)) < 0)
			return -1;
	}
	if (f.https >= 0 && PyDict_SetItem(scope, K_SCHEME, f.https ? V_HTTPS : V_HTTP) < 0)
		return -1;
	if (f.prefix_len && (prepend(scope, K_ROOT_PATH, &f) < 0 || prepend(scope, K_PATH, &f) < 0))
		return -1;
	return 0;
}
