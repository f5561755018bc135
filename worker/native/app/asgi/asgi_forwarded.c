/* The ASGI adapter's part of the trusted proxy headers (forwarded.h): what
 * a trusted request's forwarding fields said (fwd_read) put in its scope:
 * client (host, port 0 unless the proxy said it), scheme, and the
 * X-Forwarded-Prefix before root_path and path (path is the whole path
 * the client asked for, asgi_scope.c). The headers stay as they came.
 *
 * May call: the codec (fwd_fields.c).
 */
#include "asgi.h"

static PyObject *K_CLIENT, *K_SCHEME, *K_ROOT_PATH, *K_PATH, *V_HTTPS, *V_HTTP;

int asgi_fwd_make_keys(void)
{
	struct { PyObject **at; const char *s; } keys[] = {
		{&K_CLIENT, "client"}, {&K_SCHEME, "scheme"}, {&K_ROOT_PATH, "root_path"},
		{&K_PATH, "path"}, {&V_HTTPS, "https"}, {&V_HTTP, "http"},
	};

	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!(*keys[i].at = PyUnicode_InternFromString(keys[i].s)))
			return -1;
	return 0;
}

int fwd_scope(struct conn *c, PyObject *scope)
{
	struct fwd_found f;
	int rc = fwd_read(c, &f);

	if (rc <= 0)
		return rc;
	if (f.family) {
		PyObject *host = fwd_addr_str(&f), *client;

		client = host ? Py_BuildValue("(Ni)", host, f.port) : NULL;
		rc = client ? PyDict_SetItem(scope, K_CLIENT, client) : -1;
		Py_XDECREF(client);
		if (rc < 0)
			return -1;
	}
	if (f.https >= 0 && PyDict_SetItem(scope, K_SCHEME, f.https ? V_HTTPS : V_HTTP) < 0)
		return -1;
	if (f.prefix_len && (fwd_prepend(scope, K_ROOT_PATH, &f) < 0 ||
	                     fwd_prepend(scope, K_PATH, &f) < 0))
		return -1;
	return 0;
}
