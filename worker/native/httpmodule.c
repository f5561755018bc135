/* sockherd.worker._http: the HTTP/1.1 request path in native code, one
 * CPython extension built of three layers (conn.h draws them): the
 * connection layer (conn_*.c, dispatch.c, engine*.c), the HTTP/1 codec
 * (httpscan.c, httpparse.c, h1_*.c) and the WSGI and ASGI adapters
 * (wsgi_*.c, asgi_*.c),
 * assembled by the Server type (server.c). This file is the module: its
 * exceptions, its types readied with each layer's methods joined, its
 * functions.
 *
 * May call: every layer's types and method tables, nothing else.
 */
#include "assembly.h"
#include "wsgi.h"
#include "asgi.h"
#include "asgi_ws.h"               /* issue 23: the WebSocket codec (ws.h) and adapter */
#include "conn_tls.h"


/* The methods of a type several layers add to (the connection: its own,
 * the codec's refuse, the adapter's respond; RequestParser: the codec's,
 * the adapter's next_request), joined into one table before the type is
 * readied: each layer keeps its methods with its code, and no layer below
 * names a function of the one above. */
#define JOINED_MAX 24
static PyMethodDef conn_methods_all[JOINED_MAX], parser_methods_all[JOINED_MAX],
                   server_methods_all[JOINED_MAX], module_methods[JOINED_MAX];

static int join_methods(PyMethodDef *out, const PyMethodDef *const *parts, int nparts)
{
	int n = 0;

	for (int i = 0; i < nparts; i++)
		for (const PyMethodDef *d = parts[i]; d->ml_name; d++) {
			if (n == JOINED_MAX - 1) {
				PyErr_SetString(PyExc_SystemError, "_http: too many methods to join");
				return -1;
			}
			out[n++] = *d;
		}
	out[n] = (PyMethodDef){NULL};
	return 0;
}

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT, "sockherd.worker._http",
	"The native HTTP/1.1 request path (llhttp, strict).", -1, module_methods,
};

PyMODINIT_FUNC PyInit__http(void)
{
	const PyMethodDef *conn_parts[] = {conn_methods, h1_conn_methods, wsgi_conn_methods};
	const PyMethodDef *parser_parts[] = {parser_methods, wsgi_parser_methods};
	const PyMethodDef *server_parts[] = {server_methods, server_accept_methods, server_asgi_methods,
	                                     fwd_server_methods, server_proxy_methods, server_tls_methods};
	/* issue 23: the WebSocket codec's and adapter's functions beside the codec's */
	const PyMethodDef *module_parts[] = {h1_module_methods, proxy_module_methods, ws_module_methods,
	                                     asgi_ws_module_methods};
	PyObject *m;

	if (join_methods(conn_methods_all, conn_parts, 3) < 0 ||
	    join_methods(parser_methods_all, parser_parts, 2) < 0 ||
	    join_methods(server_methods_all, server_parts, 6) < 0 ||
	    join_methods(module_methods, module_parts, 4) < 0)
		return NULL;
	ConnType.tp_methods = conn_methods_all;
	ParserType.tp_methods = parser_methods_all;
	ServerType.tp_methods = server_methods_all;
	server_type = &ServerType;                /* the layers' type checks (server.h) */
	if (PyType_Ready(&ParserType) < 0 || PyType_Ready(&ServerType) < 0 ||
	    PyType_Ready(&ConnType) < 0 || PyType_Ready(&RespondType) < 0 ||
	    PyType_Ready(&AsgiCallType) < 0 || PyType_Ready(&AsgiReadyType) < 0 ||
	    PyType_Ready(&WsParserType) < 0 || PyType_Ready(&WsCallType) < 0)  /* issue 23 */
		return NULL;
	if (make_keys() < 0 || wsgi_fwd_make_keys() < 0 || asgi_fwd_make_keys() < 0 ||
	    asgi_make_app() < 0 || asgi_ws_make_keys() < 0)
		return NULL;
	m = PyModule_Create(&module);
	if (!m)
		return NULL;
	HttpError = PyErr_NewExceptionWithDoc(
	    "sockherd.worker._http.HttpError",
	    "A request refused: args are (status, reason); the connection must close.",
	    PyExc_ValueError, NULL);
	ClientGone = PyErr_NewExceptionWithDoc(
	    "sockherd.worker._http.ClientGone",
	    "The client closed or reset the connection, or stopped reading or sending, while\n"
	    "the app read or wrote.", PyExc_Exception, NULL);
	BadBody = PyErr_NewExceptionWithDoc(
	    "sockherd.worker._http.BadBody",
	    "The request body's framing is invalid: args are (status, reason); the\n"
	    "connection cannot carry another request.", PyExc_Exception, NULL);
	ClientDisconnected = PyErr_NewExceptionWithDoc(
	    "sockherd.worker._http.ClientDisconnected",
	    "An ASGI send() after the client went away (an OSError, as ASGI 2.4 asks).",
	    PyExc_OSError, NULL);
	if (!HttpError || !ClientGone || !BadBody || !ClientDisconnected ||
	    PyModule_AddObjectRef(m, "ClientDisconnected", ClientDisconnected) < 0 ||
	    PyModule_AddObjectRef(m, "AsgiCall", (PyObject *)&AsgiCallType) < 0 ||
	    PyModule_AddObjectRef(m, "WsParser", (PyObject *)&WsParserType) < 0 ||   /* issue 23 */
	    PyModule_AddObjectRef(m, "HttpError", HttpError) < 0 ||
	    PyModule_AddObjectRef(m, "ClientGone", ClientGone) < 0 ||
	    PyModule_AddObjectRef(m, "BadBody", BadBody) < 0 ||
	    PyModule_AddObjectRef(m, "RequestParser", (PyObject *)&ParserType) < 0 ||
	    PyModule_AddObjectRef(m, "Server", (PyObject *)&ServerType) < 0 ||
	    PyModule_AddObjectRef(m, "HttpConn", (PyObject *)&ConnType) < 0 ||
	    PyModule_AddObjectRef(m, "Respond", (PyObject *)&RespondType) < 0) {
		Py_DECREF(m);
		return NULL;
	}
	return m;
}
