/* The engine (engine/): the loop turn (engine.c), accept and take
 * (engine_accept.c) and the group's shared queue (dispatch.c), above the
 * connection layer (conn/: the Server, server.h, and the connections).
 */
#ifndef SOCKHERD_ENGINE_H
#define SOCKHERD_ENGINE_H

#include "server.h"

extern PyMethodDef server_methods[];       /* engine.c */
extern PyMethodDef server_accept_methods[]; /* engine_accept.c: accept, take, serve_accepted */

/* engine.c: loop thread pos entered a handler at `when` (0: left them):
 * the busy list's stamp (the relief's, the request timeout's), when given */
/* The relief's (and the timeout's) stamp of loop thread pos: when it
 * entered the app (0.0: it left), in s->busy; nothing without it. Inline:
 * dispatch.c stamps the threads it hands a request to, below engine.c. */
static inline int engine_stamp(Server *s, int pos, double when)
{
	PyObject *f;

	if (s->busy == Py_None)
		return 0;
	f = PyFloat_FromDouble(when);
	return f ? PyList_SetItem(s->busy, pos, f) : -1;
}
/* Loop thread pos, now the calling OS thread's (see bind), or NULL.
 * Inline: engine.c's turn and engine_accept.c's accept and take each
 * bind through it, and neither file calls the other. */
static inline struct srv_thread *as_thread(Server *s, int pos)
{
	if (pos < 0 || pos >= s->nthreads) {
		PyErr_SetString(PyExc_IndexError, "no such loop thread");
		return NULL;
	}
	srv_bind(s, pos);
	return &s->thr[pos];
}

/* dispatch.c: one report or due timer for a group-shared connection */
int dispatch_run(struct conn *c, int pos, uint32_t events, int kind);
/* dispatch.c: the group's queue: a batch that ran past SPILL_AFTER, or
 * any poll while the group has queued work, hands its reports to it
 * (spill), run oldest first by every thread of the group after its poll
 * (run_spilled); free_spilled at the engine's end. */
void dispatch_spill(Server *s, struct conn *c, uint32_t events);
void dispatch_wake_idle(Server *s, int pos);
int dispatch_run_spilled(Server *s, int pos);
void dispatch_free_spilled(Server *s);

/* The queue of loop thread pos's group. */
static inline struct runq *srv_runq(Server *s, int pos)
{
	return &s->thr[s->thr[pos].lead].rq;
}

/* Whether work of pos's group is queued (its poll must not sleep then). */
static inline int dispatch_has_spilled(Server *s, int pos)
{
	return srv_runq(s, pos)->head != NULL;
}

#endif /* SOCKHERD_ENGINE_H */
