/* The Server type (the Python face of one worker's engine, engine.c):
 * its construction (the fdcore functions it calls, its loop threads, its
 * app and settings, the default tables: WSGI over HTTP/1, server.c), the
 * life of the references it holds (traverse, clear, dealloc), and the type
 * object that joins them with server.c's attributes and engine.c's
 * methods (httpmodule.c joins the other layers' methods).
 *
 * Apart from the assembly (server.c): a Server is built and freed once,
 * and what it holds is the same whichever tables it serves with.
 *
 * May call: everything below it; server.c's tables and attributes by name.
 */
#include "assembly.h"
#include "h1.h"
#include "conn_tls.h"

#include <openssl/ssl.h>

/* ---- construction ---------------------------------------------------------------------------------- */

static int api_fn(PyObject *api, const char *name, void **out)
{
	PyObject *v = PyDict_GetItemString(api, name);       /* borrowed */
	unsigned long long addr;

	if (!v) {
		PyErr_Format(PyExc_KeyError, "fdcore function %s missing", name);
		return -1;
	}
	addr = PyLong_AsUnsignedLongLong(v);
	if (PyErr_Occurred())
		return -1;
	*out = (void *)(uintptr_t)addr;
	return 0;
}

static int Server_init(Server *s, PyObject *args, PyObject *kw)
{
	static char *names[] = {"loop", "api", "threads", "maxfd", "kind_conn", "app", "base", "slow",
	                        "access", "report", "sendfile", "file_wrapper", "bytes_io", "no_body",
	                        "event_type", "busy", "enter_app", "limits", "script_name",
	                        "server_line", "header_timeout", "keepalive_timeout",
	                        "body_timeout", "body_buffer", "min_body_rate", "ws_ping_interval",
	                        "ws_ping_timeout", NULL};
	PyObject *loop, *api, *threads, *app, *base, *slow, *access, *report, *sendfile, *fw, *bio, *nob;
	PyObject *evt, *busy, *enter_app, *script_name, *server_line, *seq;
	unsigned int line, field_size, nheaders;
	unsigned long long body;
	int maxfd;
	unsigned int kind;
	double ht, kt, bt, rate, ping, pong;
	Py_ssize_t bbuf;

	if (s->thr) {
		PyErr_SetString(PyExc_RuntimeError, "Server is set up once");
		return -1;
	}
	s->ops = &h1_conn_ops;
	s->app_ops = &wsgi_app_ops;
	if (!PyArg_ParseTupleAndKeywords(args, kw, "$OO!OiIOO!OOOOOOOOOO(IIIK)UO!dddnddd", names, &loop,
	                                 &PyDict_Type, &api, &threads, &maxfd, &kind, &app,
	                                 &PyDict_Type, &base, &slow, &access, &report, &sendfile, &fw,
	                                 &bio, &nob, &evt, &busy, &enter_app, &line, &field_size, &nheaders,
	                                 &body, &script_name, &PyBytes_Type, &server_line, &ht, &kt,
	                                 &bt, &bbuf, &rate, &ping, &pong))
		return -1;
	if (!(ping >= 0) || !(pong >= 0)) {
		PyErr_SetString(PyExc_ValueError, "ws_ping_interval and ws_ping_timeout must not be "
		                "negative (0: never)");
		return -1;
	}
	if (bbuf < 0 || rate < 0) {
		PyErr_SetString(PyExc_ValueError, "body_buffer and min_body_rate must not be negative");
		return -1;
	}
	if (maxfd <= 0 || !line || !field_size || !nheaders) {
		PyErr_SetString(PyExc_ValueError, "maxfd and the limits must be positive");
		return -1;
	}
	if (api_fn(api, "fdc_poll", (void **)&s->api.poll) < 0 ||
	    api_fn(api, "fdc_enter", (void **)&s->api.enter) < 0 ||
	    api_fn(api, "fdc_leave", (void **)&s->api.leave) < 0 ||
	    api_fn(api, "fdc_leave_batch", (void **)&s->api.leave_batch) < 0 ||
	    api_fn(api, "fdc_delete", (void **)&s->api.delete) < 0 ||
	    api_fn(api, "fdc_want_recv", (void **)&s->api.want_recv) < 0 ||
	    api_fn(api, "fdc_stop_recv", (void **)&s->api.stop_recv) < 0 ||
	    api_fn(api, "fdc_want_send", (void **)&s->api.want_send) < 0 ||
	    api_fn(api, "fdc_stop_send", (void **)&s->api.stop_send) < 0 ||
	    api_fn(api, "fdc_cant_recv", (void **)&s->api.cant_recv) < 0 ||
	    api_fn(api, "fdc_insert", (void **)&s->api.insert) < 0 ||
	    api_fn(api, "fdc_accept", (void **)&s->api.accept) < 0 ||
	    api_fn(api, "fdc_counters", (void **)&s->api.counters) < 0 ||
	    api_fn(api, "fdc_insert_shared", (void **)&s->api.insert_shared) < 0 ||
	    api_fn(api, "fdc_wake", (void **)&s->api.wake) < 0 ||
	    api_fn(api, "fdc_dump", (void **)&s->api.dump) < 0 ||
	    api_fn(api, "table", (void **)&s->table) < 0)
		return -1;
	seq = PySequence_Fast(threads, "threads: a list of (Thread, address, tgid, bit)");
	if (!seq)
		return -1;
	s->nthreads = (int)PySequence_Fast_GET_SIZE(seq);
	s->thr = PyMem_Calloc((size_t)(s->nthreads ? s->nthreads : 1), sizeof(*s->thr));
	s->conns = PyMem_Calloc((size_t)maxfd, sizeof(*s->conns));
	if (!s->thr || !s->conns) {
		Py_DECREF(seq);
		PyErr_NoMemory();
		return -1;
	}
	for (int i = 0; i < s->nthreads; i++) {
		PyObject *obj;
		unsigned long long addr, bit;
		int tgid;

		if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OKiK", &obj, &addr, &tgid, &bit)) {
			Py_DECREF(seq);
			return -1;
		}
		s->thr[i].th = (struct fdc_thread *)(uintptr_t)addr;
		{
			PyObject *tid = PyObject_GetAttrString(obj, "tid");

			s->thr[i].tid = tid ? (int)PyLong_AsLong(tid) : -1;
			Py_XDECREF(tid);
			if (PyErr_Occurred()) {
				Py_DECREF(seq);
				return -1;
			}
		}
		s->thr[i].obj = Py_NewRef(obj);
		s->thr[i].tgid = tgid;
		s->thr[i].bit = bit;
		s->thr[i].lead = i;
		for (int j = 0; j < i; j++)
			if (s->thr[j].tgid == tgid) {
				s->thr[i].lead = j;
				break;
			}
	}
	Py_DECREF(seq);
	s->maxfd = maxfd;
	s->kind_conn = kind;
	s->next_cookie = 1ull << 40;        /* apart from the Python loop's listener cookies */
	s->loop = Py_NewRef(loop);
	s->conns_dict = PyObject_GetAttrString(loop, "conns");
	s->forget = PyObject_GetAttrString(loop, "forget");
	s->post = PyObject_GetAttrString(loop, "post");
	if (!s->conns_dict || !s->forget || !s->post)
		return -1;
	if (!PyDict_Check(s->conns_dict)) {
		PyErr_SetString(PyExc_TypeError, "loop.conns must be a dict");
		return -1;
	}
	s->app = Py_NewRef(app);
	s->base = Py_NewRef(base);
	s->slow = Py_NewRef(slow);
	s->access = Py_NewRef(access);
	if (access != Py_None) {
		PyObject *w = PyObject_GetAttrString(access, "wants_response_headers");
		s->access_headers = w && PyObject_IsTrue(w) == 1;
		Py_XDECREF(w);
		PyErr_Clear();              /* an access log without the attribute: no headers */
	}
	s->report = Py_NewRef(report);
	s->sendfile = Py_NewRef(sendfile);
	s->file_wrapper = Py_NewRef(fw);
	s->bytes_io = Py_NewRef(bio);
	s->no_body = Py_NewRef(nob);
	s->event_type = Py_NewRef(evt);
	s->busy = Py_NewRef(busy);
	s->enter_app = Py_NewRef(enter_app);
	s->lim.line = line;
	s->lim.field_size = field_size;
	s->lim.fields = nheaders;
	s->lim.body = body;
	s->script_name = Py_NewRef(script_name);
	s->server_line = Py_NewRef(server_line);
	s->header_timeout = ht;
	s->keepalive_timeout = kt;
	s->body_timeout = bt;
	s->body_buffer = (size_t)bbuf;
	s->min_body_rate = rate;
	s->ws_ping_interval = ping;
	s->ws_ping_timeout = pong;
	if (busy != Py_None && (!PyList_Check(busy) || PyList_GET_SIZE(busy) < s->nthreads)) {
		PyErr_SetString(PyExc_TypeError, "busy: None or a list, one float per loop thread");
		return -1;
	}
	return 0;
}

static int Server_traverse(Server *s, visitproc visit, void *arg)
{
	for (int i = 0; s->thr && i < s->nthreads; i++) {
		Py_VISIT(s->thr[i].obj);
		Py_VISIT(s->thr[i].aio);
		/* the connections whose answers are queued (h1_conn.c, owe): each
		 * holds a reference to this Server, so a cycle the collector must
		 * see (a stopped engine's list is never written again) */
		for (struct conn *c = s->thr[i].owed; c; c = c->owed_next)
			Py_VISIT(c);
	}
	Py_VISIT(s->file_wrapper);
	Py_VISIT(s->bytes_io);
	Py_VISIT(s->no_body);
	Py_VISIT(s->event_type);
	Py_VISIT(s->loop);
	Py_VISIT(s->conns_dict);
	Py_VISIT(s->forget);
	Py_VISIT(s->post);
	Py_VISIT(s->app);
	Py_VISIT(s->fwd.log);
	Py_VISIT(s->base);
	Py_VISIT(s->scope_base);
	Py_VISIT(s->slow);
	Py_VISIT(s->access);
	Py_VISIT(s->report);
	Py_VISIT(s->sendfile);
	Py_VISIT(s->enter_app);
	Py_VISIT(s->busy);
	Py_VISIT(s->on_retire);
	Py_VISIT(s->on_refusal);
	for (int i = 0; s->thr && i < s->nthreads; i++)
		for (struct conn *c = s->thr[i].rq.head; c; c = c->qnext)
			Py_VISIT(c);
	return 0;
}

static int Server_clear(Server *s)
{
	Py_CLEAR(s->loop);
	Py_CLEAR(s->conns_dict);
	Py_CLEAR(s->forget);
	Py_CLEAR(s->post);
	Py_CLEAR(s->app);
	Py_CLEAR(s->base);
	Py_CLEAR(s->scope_base);
	Py_CLEAR(s->slow);
	Py_CLEAR(s->access);
	Py_CLEAR(s->report);
	Py_CLEAR(s->sendfile);
	Py_CLEAR(s->enter_app);
	Py_CLEAR(s->busy);
	Py_CLEAR(s->on_retire);
	Py_CLEAR(s->on_refusal);
	Py_CLEAR(s->fwd.log);
	for (int i = 0; s->thr && i < s->nthreads; i++)
		Py_CLEAR(s->thr[i].aio);
	dispatch_free_spilled(s);
	tls_replay_free(s);
	h1_owed_free(s);
	return 0;
}

static void Server_dealloc(Server *s)
{
	PyObject_GC_UnTrack(s);
	Server_clear(s);
	if (s->conns) {
		for (int fd = 0; fd < s->maxfd; fd++)
			Py_XDECREF(s->conns[fd]);
		PyMem_Free(s->conns);
	}
	if (s->thr) {
		for (int i = 0; i < s->nthreads; i++)
			Py_XDECREF(s->thr[i].obj);
		PyMem_Free(s->thr);
	}
	Py_XDECREF(s->file_wrapper);
	Py_XDECREF(s->bytes_io);
	Py_XDECREF(s->no_body);
	Py_XDECREF(s->event_type);
	Py_XDECREF(s->script_name);
	Py_XDECREF(s->server_line);
	Py_XDECREF(s->local_obj);
	Py_XDECREF(s->local_port);
	Py_XDECREF(s->peer_host);
	fwd_free(&s->fwd);
	netmatch_free(&s->proxy_allow);
	SSL_CTX_free(s->tls_ctx);
	Py_XDECREF(s->tls_server_pem);
	Py_TYPE(s)->tp_free((PyObject *)s);
}

PyTypeObject ServerType = {
	PyVarObject_HEAD_INIT(NULL, 0)
	.tp_name = "sockherd.worker._http.Server",
	.tp_doc = "The native wsgi engine of one worker (see engine.c).",
	.tp_basicsize = sizeof(Server),
	.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
	.tp_new = PyType_GenericNew,
	.tp_init = (initproc)Server_init,
	.tp_dealloc = (destructor)Server_dealloc,
	.tp_traverse = (traverseproc)Server_traverse,
	.tp_clear = (inquiry)Server_clear,
	.tp_methods = server_methods,               /* engine.c */
	.tp_getset = Server_getset,
};
