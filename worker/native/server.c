/* The Server type: the Python face of one worker's engine (engine.c), and
 * the assembly of the layers: a Server serves one app interface over one
 * protocol, and picks here the tables through which each layer reaches
 * the one above it. Today: HTTP/1 (h1_conn.c) under the connection layer,
 * WSGI (wsgi_app.c) under the codec; an ASGI adapter adds its own struct
 * app_ops beside wsgi_app_ops, and a Server built for it picks that one.
 *
 * This file holds the tables and what picks them (interface, dispatch),
 * with the Server's other attributes (its counts, draining) and set_aio;
 * the type itself, its construction and its references' life are
 * server_type.c's, above this one (it names the default tables and the
 * attributes here; this file names nothing of it).
 *
 * May call: everything below it (it is above every layer); it only names
 * the layers' entry points in the tables and sets the engine up.
 */
#include "assembly.h"
#include "h1.h"
#include "wsgi.h"
#include "asgi.h"
#include "asgi_ws.h"               /* issue 23: the WebSocket adapter's entries */

/* What the connection layer calls above it: the HTTP/1 codec's request
 * loop, and the adapter's parked response (its bytes owed, its end) */
/* What the connection layer calls above it: the HTTP/1 codec's entries
 * only, the same for every interface (the codec reaches the adapter
 * through the Server's app_ops) */
const struct conn_ops h1_conn_ops = {
	.open = h1_open,
	.readable = h1_readable,
	.read_first = h1_read_first,
	.serve_first = h1_serve_first,
	.resume = h1_resume,
	.timeout = h1_timeout,
	.rearm = h1_rearm,
	.unread = h1_unread,
	.owed = h1_owed,
	.closed = h1_closed,
	.write_owed = h1_owed_run,
};

/* What the HTTP/1 codec calls above it: the WSGI adapter */
const struct app_ops wsgi_app_ops = {
	.request = wsgi_request,
	.serve = wsgi_serve,
	.resume = respond_resume,
	.abandon = respond_abandon,
	.owed = wsgi_owed,
};

/* ... or the ASGI adapter, whose calls outlive serve (asgi.h) and which
 * never parks a response (its bodies go out from send) */
static const struct app_ops asgi_app_ops = {
	.request = asgi_request,
	/* issue 23: an upgrade to WebSocket is asgi_ws.c's, each of these
	 * hands the rest to asgi_app.c's asgi_serve / _resume / _input / _drop */
	.serve = asgi_ws_serve,
	.resume = asgi_ws_resume,
	.input = asgi_ws_input,
	.drop = asgi_ws_drop,
	.lingers = asgi_ws_lingers,                /* a close handshake awaited */
	.timer = asgi_ws_timer,                    /* issue 35, point 27: the ping */
};


static PyObject *get_draining(Server *s, void *c)
{
	(void)c;
	return PyBool_FromLong(s->draining);
}

static int set_draining(Server *s, PyObject *v, void *c)
{
	int t = v ? PyObject_IsTrue(v) : -1;

	(void)c;
	if (t < 0)
		return -1;
	s->draining = t;
	return 0;
}

static PyObject *get_dispatch(Server *s, void *c)
{
	(void)c;
	return PyBool_FromLong(s->dispatch);
}

/* Set before the first connection: each is then shared by the loop
 * threads of its group (dispatch.c). */
static int set_dispatch(Server *s, PyObject *v, void *c)
{
	int on = v ? PyObject_IsTrue(v) : -1;

	(void)c;
	if (on < 0)
		return -1;
	if (s->count) {
		PyErr_SetString(PyExc_RuntimeError, "dispatch is set before the first connection");
		return -1;
	}
	if (on && s->app_ops == &asgi_app_ops) {
		PyErr_SetString(PyExc_ValueError, "an ASGI Server does not dispatch (asgi_app.c)");
		return -1;
	}
	for (int i = 0; i < s->nthreads; i++) {
		s->thr[i].group_mask = 0;
		for (int j = 0; j < s->nthreads; j++)
			if (s->thr[j].tgid == s->thr[i].tgid)
				s->thr[i].group_mask |= s->thr[j].bit;
	}
	s->dispatch = on;
	return 0;
}

static PyObject *get_interface(Server *s, void *c)
{
	(void)c;
	return PyUnicode_FromString(s->app_ops == &asgi_app_ops ? "asgi" : "wsgi");
}

/* "wsgi" (the default) or "asgi": which adapter serves the app, set
 * before the first connection; an ASGI one never shares a connection
 * among threads (asgi_app.c) */
static int set_interface(Server *s, PyObject *v, void *c)
{
	(void)c;
	if (!v || !PyUnicode_Check(v)) {
		PyErr_SetString(PyExc_TypeError, "interface: 'wsgi' or 'asgi'");
		return -1;
	}
	if (s->count) {
		PyErr_SetString(PyExc_RuntimeError, "interface is set before the first connection");
		return -1;
	}
	if (PyUnicode_CompareWithASCIIString(v, "asgi") == 0) {
		if (s->dispatch) {
			PyErr_SetString(PyExc_ValueError, "an ASGI Server does not dispatch (asgi_app.c)");
			return -1;
		}
		PyObject *base = asgi_scope_base(s->base);     /* each http scope a copy of it */

		if (!base)
			return -1;
		Py_XSETREF(s->scope_base, base);
		s->ops = &h1_conn_ops;
		s->app_ops = &asgi_app_ops;
	}
	else if (PyUnicode_CompareWithASCIIString(v, "wsgi") == 0) {
		s->ops = &h1_conn_ops;
		s->app_ops = &wsgi_app_ops;
	}
	else {
		PyErr_Format(PyExc_ValueError, "interface %R: 'wsgi' or 'asgi'", v);
		return -1;
	}
	return 0;
}

static PyObject *get_requests(Server *s, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(s->requests);
}

static PyObject *get_count(Server *s, void *c)
{
	(void)c;
	return PyLong_FromLong(s->count);
}

static PyObject *get_responses(Server *s, void *c)
{
	(void)c;
	return Py_BuildValue("{sKsKsKsKsKsK}", "1xx", s->responses[1], "2xx", s->responses[2],
	                     "3xx", s->responses[3], "4xx", s->responses[4],
	                     "5xx", s->responses[5], "other", s->responses[0]);
}

/* ((bound, count)..., (inf, count), sum): non-cumulative counts, one read
 * under the GIL, so the counts and the sum are of the same requests */
static PyObject *get_durations(Server *s, void *c)
{
	static const double bounds[DURATION_BUCKETS] = DURATION_BOUNDS;
	PyObject *buckets = PyTuple_New(DURATION_BUCKETS + 1), *out;

	(void)c;
	if (!buckets)
		return NULL;
	for (int i = 0; i <= DURATION_BUCKETS; i++) {
		PyObject *b = Py_BuildValue("(dK)", i < DURATION_BUCKETS ? bounds[i] : Py_HUGE_VAL,
		                            s->durations[i]);

		if (!b) {
			Py_DECREF(buckets);
			return NULL;
		}
		PyTuple_SET_ITEM(buckets, i, b);
	}
	out = Py_BuildValue("(Nd)", buckets, s->duration_sum);
	return out;
}

static PyObject *get_refused(Server *s, void *c)
{
	static const char *names[REFUSALS] = REFUSAL_NAMES;
	PyObject *d = PyDict_New();

	(void)c;
	for (int i = 0; d && i < REFUSALS; i++) {
		PyObject *n = PyLong_FromUnsignedLongLong(s->refused[i]);

		if (!n || PyDict_SetItemString(d, names[i], n) < 0) {
			Py_XDECREF(n);
			Py_CLEAR(d);
			break;
		}
		Py_DECREF(n);
	}
	return d;
}

static PyObject *get_proxy_refused(Server *s, void *c)
{
	(void)c;
	return PyLong_FromUnsignedLongLong(s->proxy_refused);
}

PyGetSetDef Server_getset[] = {
	{"draining", (getter)get_draining, (setter)set_draining,
	 "responses carry Connection: close", NULL},
	{"count", (getter)get_count, NULL, "open connections", NULL},
	{"dispatch", (getter)get_dispatch, (setter)set_dispatch,
	 "connections shared by the loop threads of their group: a request goes to an idle one",
	 NULL},
	{"requests", (getter)get_requests, NULL, "requests answered", NULL},
	{"interface", (getter)get_interface, (setter)set_interface,
	 "the app's interface: 'wsgi' or 'asgi' (set before the first connection)", NULL},
	{"responses", (getter)get_responses, NULL, "responses by status class", NULL},
	{"refused", (getter)get_refused, NULL, "requests the engine refused, by reason", NULL},
	{"durations", (getter)get_durations, NULL,
	 "the app's requests by duration: (((bound, count)..., (inf, count)), seconds' sum), "
	 "each count those above the bound before", NULL},
	{"proxy_refused", (getter)get_proxy_refused, NULL,
	 "connections closed over their PROXY protocol header (conn_proxy.c)", NULL},
	{NULL},
};

PyDoc_STRVAR(set_aio_doc,
"set_aio(pos, loop): loop thread pos's asyncio loop, on which an ASGI\n"
"Server runs the tasks of the requests that thread serves (worker/aio.py).");

static PyObject *Server_set_aio(Server *s, PyObject *args)
{
	int pos;
	PyObject *loop;

	if (!PyArg_ParseTuple(args, "iO:set_aio", &pos, &loop))
		return NULL;
	if (pos < 0 || pos >= s->nthreads) {
		PyErr_SetString(PyExc_IndexError, "no such loop thread");
		return NULL;
	}
	Py_XSETREF(s->thr[pos].aio, loop == Py_None ? NULL : Py_NewRef(loop));
	Py_RETURN_NONE;
}

PyMethodDef server_asgi_methods[] = {
	{"set_aio", (PyCFunction)Server_set_aio, METH_VARARGS, set_aio_doc},
	{NULL},
};
