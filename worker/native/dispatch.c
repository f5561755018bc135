/* Per-request dispatch inside a thread group (DESIGN.md section 5).
 *
 * With several loop threads in a group, each connection is shared by all
 * of them (fdcore's fdc_insert_shared): registered EPOLLEXCLUSIVE |
 * EPOLLET in every poller of the group, the accepting thread's first. The
 * kernel offers each arrival to the first of those pollers with a thread
 * asleep in it and to no other, so:
 *   - a connection whose thread waits in its poller is served by that
 *     thread (affinity, nothing handed over);
 *   - a connection whose thread is busy (in the app, or in any other
 *     connection's work) wakes ONE idle sibling, which serves the request
 *     at once: the kernel's wake-up is the hand-off, no queue, no watchdog;
 *   - with every thread busy nobody is woken: the report waits in the
 *     pollers' ready lists, and the first thread to poll takes it.
 *
 * Who handles a connection: the thread that marked it `inside`. All of
 * this runs with the GIL held, so the mark needs no atomics: a thread
 * that gets a report (or a due timer) for a connection another thread is
 * inside only records it (missed events, a missed timer) and goes on; the
 * thread inside replays what was recorded before it lets go, so nothing
 * is lost although each report came once (edge-triggered). The thread
 * inside lets the GIL go only in the app or in Python the engine calls,
 * and always returns to this file before the mark is cleared. Pipelined
 * requests keep their order because a connection has one handler at a
 * time. fdcore's running bits are taken as for any event (several threads
 * may hold one on a shared fd; they protect the fd number, not the
 * connection's state).
 *
 * The handling thread becomes the connection's owner (c->pos, c->th): its
 * context is the one an app thread of the request uses, and the one whose
 * drain step closes the connection once idle. Timers stay in the list they
 * were armed in; whichever thread fires one handles it as an event.
 */
#include "http.h"

/* c's handler thread is pos from now (the GIL's: c is not inside another). */
static void own(HttpConn *c, int pos)
{
	Server *s = c->srv;

	if (c->pos == pos)
		return;
	c->pos = pos;
	Py_SETREF(c->th, Py_NewRef(s->thr[pos].obj));
}

/* Runs one report (events != 0) or one due timer (kind >= 0) for c on
 * loop thread pos, which holds a running bit on c's fd, then whatever other
 * threads recorded for c meanwhile. Returns 0, or -1 with the Python error
 * of a handler that is not the app's (the caller contains it). */
int dispatch_run(HttpConn *c, int pos, uint32_t events, int kind)
{
	int rc = 0;

	if (c->inside >= 0) {
		/* another thread works on c (it let the GIL go): it replays this */
		if (events)
			c->missed |= events;
		if (kind >= 0)
			c->missed_timer = kind;
		return 0;
	}
	c->inside = pos;
	own(c, pos);
	for (;;) {
		if (c->closed)
			break;
		if (events)
			rc = hconn_on_events(c, events);
		else if (kind >= 0)
			rc = hconn_on_timeout(c, kind);
		if (rc < 0 || c->closed)
			break;
		events = c->missed;
		kind = c->missed_timer;
		c->missed = 0;
		c->missed_timer = -1;
		/* a deadline that passed while we worked is stale once we armed
		 * a new one (a keep-alive timer that fired during the request
		 * that just re-armed it must not close the connection) */
		if (kind >= 0 && c->tkind >= 0)
			kind = -1;
		if (!events && kind < 0)
			break;
	}
	c->inside = -1;
	c->missed = 0;
	c->missed_timer = -1;
	return rc;
}
