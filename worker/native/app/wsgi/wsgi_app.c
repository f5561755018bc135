/* The WSGI adapter's entry points: a request head made an environ and
 * served (struct app_ops: wsgi_request, wsgi_serve), the app run and its
 * answer framed (respond), a parked body's turn and end (respond_resume,
 * respond_abandon), and what ends every response: the app's errors
 * answered or logged, close() of its iterable, the access log, the counts.
 *
 *  - an exception of the app, any BaseException: 500 if nothing was sent,
 *    else the connection closes; logged with the request line, the loop
 *    thread serves on (tests/worker/test_app_containment.py).
 *
 * May call: wsgi_body.c, wsgi_respond.c, wsgi_environ.c, the codec
 * (h1_parser.c, h1_timers.c's refusal), the connection layer (conn_io.c).
 */
#include <string.h>

#include "wsgi.h"

/* a request body that cannot be read (wsgi.h): made by the module's init */
PyObject *BadBody;

/* ---- the codec's calls: a request, served -------------------------------------------------- */

/* What a PROXY protocol header told (conn_proxy.c), as proxy.<key>
 * environ keys: proxy.version, proxy.local, proxy.peer (the proxy's own
 * address), proxy.src, proxy.dst, and the TLVs' proxy.alpn,
 * proxy.authority, proxy.unique_id, proxy.ssl (a dict). Only on a
 * connection that had a header. */
static int set_proxy_keys(PyObject *info, PyObject *env)
{
	PyObject *k, *v;
	Py_ssize_t pos = 0;

	while (PyDict_Next(info, &pos, &k, &v)) {
		PyObject *key = PyUnicode_FromFormat("proxy.%U", k);
		int rc;

		if (!key)
			return -1;
		/* a dict (ssl) copied: the app may change its own */
		v = PyDict_Check(v) ? PyDict_Copy(v) : Py_NewRef(v);
		rc = v ? PyDict_SetItem(env, key, v) : -1;
		Py_DECREF(key);
		Py_XDECREF(v);
		if (rc < 0)
			return -1;
	}
	return 0;
}

static int set_addr(struct conn *c, PyObject *env)
{
	PyObject *keys[] = {K_SERVER_NAME, K_SERVER_PORT, K_REMOTE_ADDR, K_REMOTE_PORT};
	PyObject *addr = conn_addr(c);

	if (!addr)
		return -1;

	/* SERVER_NAME and SERVER_PORT are already set when the target was in
	 * absolute-form: its authority is the request's (RFC 9112 3.2.2) */
	for (int i = 0; i < 2; i++)
		if (!PyDict_SetDefault(env, keys[i], PyTuple_GET_ITEM(addr, i)))
			return -1;
	for (int i = 2; i < 4; i++)
		if (PyDict_SetItem(env, keys[i], PyTuple_GET_ITEM(addr, i)) < 0)
			return -1;
	return c->proxy ? set_proxy_keys(c->proxy, env) : 0;
}

/* A parsed head's environ, with the connection's addresses: struct
 * app_ops's request. */
PyObject *wsgi_request(struct conn *c)
{
	PyObject *env = build_environ(c->parser, c->srv->base);

	/* a trusted proxy's fields (forwarded.h): only its connections look */
	/* TLS: HTTPS, the scheme and the session's SSL_* keys (wsgi_tls.c),
	 * before a trusted proxy's fields, which may say more */
	PyObject *tls = env && c->ssl ? wsgi_tls_environ(c) : NULL;     /* NULL: an error set */

	if (env && (set_addr(c, env) < 0 || (c->ssl && (!tls || PyDict_Update(env, tls) < 0)) ||
	            (c->trusted && fwd_environ(c, env) < 0))) {
		Py_DECREF(env);
		return NULL;
	}
	return env;
}

/* A request whose body is all here (or that has none), start to end. */
static int serve_whole(struct conn *c, PyObject *env)
{
	Parser *p = c->parser;
	PyObject *body, *input;

	if (p->blen == p->bstart)
		input = Py_NewRef(c->srv->no_body);      /* most requests: no BytesIO to make */
	else {
		body = PyBytes_FromStringAndSize(p->body + p->bstart, (Py_ssize_t)(p->blen - p->bstart));
		if (!body)
			return -1;
		p->bstart = p->blen;                  /* the app's, through wsgi.input */
		input = PyObject_CallOneArg(c->srv->bytes_io, body);
		Py_DECREF(body);
	}
	if (!input || PyDict_SetItem(env, K_WSGI_INPUT, input) < 0) {
		Py_XDECREF(input);
		return -1;
	}
	Py_DECREF(input);
	return respond(c, env, 1);        /* the codec finishes the request (parser_finish) */
}

/* The rest of the body still to come, or a 100 Continue owed: wsgi.py's
 * slow path streams it (serve_slow(conn, env) -> keep). */
static int serve_streaming(struct conn *c, PyObject *env)
{
	PyObject *r = PyObject_CallFunctionObjArgs(c->srv->slow, (PyObject *)c, env, NULL);
	int keep;

	if (!r)
		return -1;
	keep = PyObject_IsTrue(r);
	Py_DECREF(r);
	return keep;
}

/* struct app_ops's serve: the app for env, its body whole or still coming */
int wsgi_serve(struct conn *c, PyObject *env, int whole)
{
	return whole ? serve_whole(c, env) : serve_streaming(c, env);
}

/* ---- running the app ------------------------------------------------------------------------ */

static void close_result(Server *s, PyObject *env, PyObject *result)
{
	PyObject *close, *rc;

	if (!result || PyList_CheckExact(result) || PyTuple_CheckExact(result) ||
	    PyBytes_CheckExact(result))
		return;
	close = PyObject_GetAttrString(result, "close");
	if (!close) {
		if (PyErr_ExceptionMatches(PyExc_AttributeError))
			PyErr_Clear();
		else
			report_exc(s, env, "close() of the app's response");
		return;
	}
	rc = PyObject_CallNoArgs(close);
	Py_DECREF(close);
	if (!rc)
		report_exc(s, env, "close() of the app's response");
	Py_XDECREF(rc);
}

static void access_log(Server *s, PyObject *env, Respond *r, double started)
{
	PyObject *st = r->status ? r->status : Py_None;
	PyObject *rc = s->access_headers && r->out_headers
		? PyObject_CallFunction(s->access, "OOKdO", env, st, r->f.sent, started, r->out_headers)
		: PyObject_CallFunction(s->access, "OOKd", env, st, r->f.sent, started);

	if (!rc)
		PyErr_WriteUnraisable(s->access);
	Py_XDECREF(rc);
}

static int internal_error(struct conn *c, PyObject *env, Respond **rp, int http11, int head_only)
{
	static const char body[] = "Internal Server Error\n";
	Respond *r = respond_new(c, http11, 0, head_only);
	PyObject *status, *headers, *w, *chunk;
	int rc = -1;

	if (!r)
		return -1;
	(*rp)->finished = 1;                       /* the app's own: over */
	Py_SETREF(*rp, r);
	status = PyUnicode_FromString("500 Internal Server Error");
	headers = Py_BuildValue("[(ss)(ss)]", "Content-Type", "text/plain", "Content-Length", "22");
	chunk = PyBytes_FromStringAndSize(body, (Py_ssize_t)sizeof(body) - 1);
	if (status && headers && chunk) {
		PyObject *args = PyTuple_Pack(2, status, headers);
		w = args ? Respond_call(r, args, NULL) : NULL;
		Py_XDECREF(args);
		if (w) {
			Py_DECREF(w);
			if (write_chunk(r, chunk, 0, 1, 1) == 0 && finish(r, 1) == 0)
				rc = 0;
		}
	}
	Py_XDECREF(status);
	Py_XDECREF(headers);
	Py_XDECREF(chunk);
	(void)env;
	return rc;
}

/* The end of a response (the app's iterable done, or failed, or its
 * client gone): the app's errors answered or logged, close() of its
 * iterable (once: PEP 3333), the access log, the counts. rc < 0: with the
 * error set. Takes r's reference; returns whether the connection may
 * serve on (as respond()). */
static int respond_end(struct conn *c, Respond *r, int rc)
{
	Server *s = c->srv;
	PyObject *env = r->env, *result = r->result;     /* ours from here */
	double started = r->since;
	int http11 = r->f.http11, head_only = r->f.head_only, out;
	int count = 1;          /* 1: as r->f.code at the end; 0: no response; -1: counted */

	r->env = r->result = NULL;
	r->parked = 0;
	r->file_fd = -1;
	Py_CLEAR(r->it);
	Py_CLEAR(r->tail);
	if (rc < 0) {
		if (PyErr_ExceptionMatches(ClientGone)) {
			/* gone, or not reading: closed already (conn_flush_wait), what
			 * is buffered goes nowhere. Still open: a request body that did
			 * not come; the answers owed before it (pipelined) still go
			 * out, then the connection closes (keep = 0 below; the send
			 * timer bounds the wait) */
			PyErr_Clear();
			if (!r->headers_sent)
				count = 0;                  /* no response at all: "other" */
		}
		else if (PyErr_ExceptionMatches(BadBody)) {
			PyObject *t, *v, *tb;
			int status = 400;
			const char *reason = "bad request body";

			PyErr_Fetch(&t, &v, &tb);
			PyErr_NormalizeException(&t, &v, &tb);
			PyObject *a = v ? PyObject_GetAttrString(v, "args") : NULL;
			if (a && PyTuple_Check(a) && PyTuple_GET_SIZE(a) == 2) {
				status = (int)PyLong_AsLong(PyTuple_GET_ITEM(a, 0));
				if (PyUnicode_Check(PyTuple_GET_ITEM(a, 1)))
					reason = PyUnicode_AsUTF8(PyTuple_GET_ITEM(a, 1));
				/* a BadBody the app raised itself may say anything: a
				 * refusal is a 4xx (it wrote "HTTP/1.1 -5 Error") */
				if (PyErr_Occurred() || !reason || status < 400 || status > 499) {
					PyErr_Clear();
					status = 400;
					reason = "bad request body";
				}
			}
			if (!r->headers_sent) {
				conn_refuse(c, status, reason);    /* the app let it through: ours to say */
				count = -1;                         /* counted by the refusal */
			}
			Py_XDECREF(a);
			Py_XDECREF(t);
			Py_XDECREF(v);
			Py_XDECREF(tb);
		}
		else {
			/* any other exception is the app's error, a BaseException
			 * (SystemExit, KeyboardInterrupt, GeneratorExit, its own)
			 * too: raised on, it ended the loop thread and left its
			 * connection open with no timer (issue 18 §1); a loop thread
			 * never ends while its worker serves (DESIGN §5) */
			report_exc(s, env, "app");
			if (!r->headers_sent && !c->closed && internal_error(c, env, &r, http11, head_only) < 0)
				report_exc(s, env, "the 500 response");
		}
		r->f.keep = 0;
	}
	r->finished = 1;
	close_result(s, env, result);
	Py_XDECREF(result);
	if (s->access != Py_None)
		access_log(s, env, r, started);
	out = r->f.keep;
	if (count >= 0) {
		srv_count(s, count ? r->f.code : 0);
		srv_time(s, started);
	}
	if (s->on_retire && s->requests >= s->retire_at) {
		/* max_requests: the worker asks to be replaced, once (>=: a
		 * limit set after that many requests, or passed by refusals,
		 * still fires at the next one) */
		PyObject *fn = s->on_retire, *ret;

		s->on_retire = NULL;
		ret = PyObject_CallNoArgs(fn);
		if (!ret)
			PyErr_WriteUnraisable(fn);
		Py_XDECREF(ret);
		Py_DECREF(fn);
	}
	Py_DECREF(r);
	Py_DECREF(env);
	return out;
}

int respond(struct conn *c, PyObject *env, int can_park)
{
	Server *s = c->srv;
	struct hp_parser *hp = c->parser->hp;
	int http11 = hp->ll.http_minor == 1, head_only = hp->ll.method == HTTP_HEAD;
	int keep = hp_keep_alive(hp) && !s->draining;       /* draining: Connection: close */
	PyObject *result;
	Respond *r = respond_new(c, http11, keep, head_only);
	int rc = -1;

	if (!r)
		return -1;
	r->since = mono_now();             /* the access log's and the histogram's start */
	r->env = Py_NewRef(env);
	Py_XSETREF(c->response, (PyObject *)Py_NewRef(r));
	result = PyObject_CallFunctionObjArgs(s->app, env, (PyObject *)r, NULL);
	if (result) {
		r->result = result;
		if ((rc = body_file(r, result, can_park)) == 0) {
			if (PyList_CheckExact(result) || PyTuple_CheckExact(result))
				rc = body_sequence(r, result, can_park);
			else
				rc = body_iterable(r, result, can_park);
		}
		if (rc == RESPOND_PARKED) {
			/* the rest goes out from the loop: the connection holds r */
			r->parked = 1;
			c->parked = r;
			return RESPOND_PARKED;
		}
		if (rc >= 0)
			rc = finish(r, !can_park);
	}
	return respond_end(c, r, rc);
}

int respond_resume(struct conn *c)
{
	Respond *r = c->parked;
	int rc;

	r->parked = 0;
	if (r->tail)
		rc = push_tail(r);
	else if (r->file_fd >= 0)
		rc = push_file(r);
	else if (conn_pending(c) >= LOW_WATER)
		rc = RESPOND_PARKED;
	else
		rc = iterate(r, 1);                  /* the app's code again, contained below */
	if (rc == RESPOND_PARKED) {
		r->parked = 1;
		return RESPOND_PARKED;
	}
	c->parked = NULL;                        /* its reference is r's now */
	if (rc >= 0)
		rc = finish(r, 0);
	return respond_end(c, r, rc);
}

void respond_abandon(Respond *r)
{
	PyObject *t, *v, *tb;

	/* called from a close, maybe with an error of the closer's pending */
	PyErr_Fetch(&t, &v, &tb);
	r->parked = 0;
	PyErr_SetString(ClientGone, "the client went away");
	(void)respond_end(r->conn, r, -1);
	PyErr_Restore(t, v, tb);
}


/* ---- the Python side: the adapter's method on the connection -------------------------------- */

PyDoc_STRVAR(respond_doc,
"respond(env) -> bool: runs the app for env (wsgi.input set by the caller)\n"
"and frames its response; False if the connection must close.");

static PyObject *Conn_respond(struct conn *c, PyObject *env)
{
	int keep;

	if (!PyDict_Check(env)) {
		PyErr_SetString(PyExc_TypeError, "env must be a dict");
		return NULL;
	}
	/* the slow path's: it reads the rest of the request body after, so
	 * the response ends here (past HIGH_WATER it waits for the client) */
	keep = respond(c, env, 0);
	if (keep < 0)
		return NULL;
	return PyBool_FromLong(keep);
}

PyMethodDef wsgi_conn_methods[] = {
	{"respond", (PyCFunction)Conn_respond, METH_O, respond_doc},
	{NULL},
};
