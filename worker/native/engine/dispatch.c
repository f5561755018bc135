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
 *
 * The group's queue (struct runq, conn/server.h), for fairness when the app blocks.
 * With every thread busy, an arrival lands in the ready list of each
 * poller it passes, and a copy stays there, at its old place, after
 * another thread served it: the connection's NEXT request is then taken
 * from that place, ahead of requests that waited longer. Run at once,
 * what a poll brings overtakes the waiting (measured, 5 ms app, 2 x 8:
 * p50 16 ms, below the ideal 20, and p99 46-48 ms). So:
 *   - a batch runs where it was polled only while the group has nothing
 *     queued, and until it has run for SPILL_AFTER (the app blocks); its
 *     rest joins the queue, once per connection (a copy merges into the
 *     entry queued already);
 *   - while the group has queued work, a poll's reports all join the
 *     queue behind it, and the thread runs the queue oldest first: one
 *     FIFO for the group, whatever poller an arrival landed in (p50 21 ms
 *     and p99 23-36 ms, granian's 26, in the same run as the above);
 *   - taking an entry with more waiting behind it wakes one sibling asleep
 *     in its poll, so idle threads start on the queue at once, not one
 *     per app call; a thread never sleeps while its group has queued work.
 * A CPU-bound batch ends before SPILL_AFTER, so that path queues nothing.
 *
 * In the connection layer, under engine.c. May call: conn_io.c (the
 * connection's handlers, contain), conn_timers.c, fdcore.
 */

#include "engine.h"

/* c's handler thread is pos from now (the GIL's: c is not inside another). */
static void own(struct conn *c, int pos)
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
int dispatch_run(struct conn *c, int pos, uint32_t events, int kind)
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
			rc = conn_on_events(c, events);
		else if (kind >= 0)
			rc = conn_on_timeout(c, kind);
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

/* Queues c's report (c referenced), once: a connection already queued
 * has the events added to its entry, which keeps its place (the kernel
 * offers an arrival to every poller it passes that has no sleeper, so a
 * busy group sees copies of it: without this the queue grew to 1,500
 * entries for 32 connections and a request waited behind them for a
 * second). O(1) either way: the entry is c itself (its qevents, linked
 * into its group's queue, conn/server.h: struct runq), found through c, never
 * by a scan. The GIL's. */
void dispatch_spill(Server *s, struct conn *c, uint32_t events)
{
	struct runq *q;

	if (c->queued) {
		/* a copy of the same arrival (offered to several pollers that had
		 * no sleeper) or a later one: the entry queued already reads it */
		c->qevents |= events;
		return;
	}
	q = srv_runq(s, c->pos);
	c->queued = s->thr[c->pos].lead + 1;
	c->qevents = events;
	c->qnext = NULL;
	c->qprev = q->tail;
	if (q->tail)
		q->tail->qnext = c;
	else
		q->head = c;
	q->tail = (struct conn *)Py_NewRef(c);
}

/* Wakes one sibling of pos asleep in its poll, if any (the others are
 * busy: they take the queue at their next turn). */
void dispatch_wake_idle(Server *s, int pos)
{
	for (int i = 1; i < s->nthreads; i++) {
		int j = (pos + i) % s->nthreads;

		if (s->thr[j].tgid == s->thr[pos].tgid && s->thr[j].asleep) {
			s->thr[j].asleep = 0;            /* one wake-up is enough */
			s->api.wake(s->table, s->thr[j].tid);
			return;
		}
	}
}

/* Runs the queued reports of pos's group, oldest first, until it has
 * run for SPILL_AFTER itself (then the rest waits for the next idle
 * thread, woken here). Errors are contained per connection. Returns the
 * reports run. The GIL's (like the whole queue). */
int dispatch_run_spilled(Server *s, int pos)
{
	int ran = 0;
	struct srv_thread *t = &s->thr[pos];
	struct runq *q = srv_runq(s, pos);
	double start = 0;
	struct conn *c;

	while ((c = q->head)) {
		uint32_t gen, events = c->qevents;

		if (start && mono_now() - start > SPILL_AFTER) {
			dispatch_wake_idle(s, pos);
			break;
		}
		if (!start)
			start = mono_now();
		runq_unlink(s, c);                     /* its reference is ours now */
		/* more of the group's work waits behind this one: a sibling asleep
		 * starts on it now, not once this entry has run (which may block) */
		if (q->head)
			dispatch_wake_idle(s, pos);
		if (!c->closed && s->conns[c->fd] == c &&
		    s->api.enter(t->th, c->fd, &gen) == FDC_DONE) {
			/* a queued request's own start: the timeout counts from
			 * here, not from the poll that queued it (nor from 0); a
			 * stamp lost to a failed float allocation only delays it */
			if (engine_stamp(s, pos, mono_now()) < 0)
				PyErr_Clear();
			if (!c->closed && dispatch_run(c, pos, events, -1) < 0)
				contain(c);                    /* as in a turn */
			s->api.leave(t->th, c->fd, gen);
			ran++;
		}
		Py_DECREF(c);
	}
	return ran;
}

/* Empties every group's queue (the engine's end, or its clear). */
void dispatch_free_spilled(Server *s)
{
	for (int i = 0; s->thr && i < s->nthreads; i++) {
		struct conn *c;

		while ((c = s->thr[i].rq.head)) {
			runq_unlink(s, c);
			Py_DECREF(c);
		}
	}
}
