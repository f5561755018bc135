/* Connection timers (the connection layer): the header timeout, the
 * keep-alive timeout, the lingering close, the send and body timeouts, a
 * WebSocket's ping interval and ping timeout, each one fixed duration, so a FIFO list per loop thread and kind is
 * sorted by deadline by construction (arm = append): arming, cancelling
 * and finding the next deadline are O(1). Only a takeover inserts out of
 * order (into the new owner's list, walking from the tail). The lists are
 * the GIL's: every change happens in C with the GIL held, with no Python
 * call between. Firing the due ones is the turn's (engine.c, fire_timers).
 *
 * May call: nothing of the engine's (the clock and the lists only).
 */
#include <time.h>

#include "server.h"

double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}


/* ---- timers ------------------------------------------------------------------------------------ */

static struct timer_list *list_of(struct conn *c)
{
	return &c->srv->thr[c->tpos].timers[c->tkind];
}

void timer_cancel(struct conn *c)
{
	struct timer_list *l;

	if (c->tkind < 0)
		return;
	l = list_of(c);
	if (c->tprev)
		c->tprev->tnext = c->tnext;
	else
		l->head = c->tnext;
	if (c->tnext)
		c->tnext->tprev = c->tprev;
	else
		l->tail = c->tprev;
	c->tprev = c->tnext = NULL;
	c->tkind = -1;
}

/* kind >= 0: a new deadline from now. kind -1: c->tkind and c->due are
 * set already (a takeover): into the owner's list at its place. */
void timer_arm(struct conn *c, int kind)
{
	Server *s = c->srv;
	struct timer_list *l;
	struct conn *after;

	if (kind >= 0) {
		double dur = kind == TIMER_HEADER ? s->header_timeout
		             : kind == TIMER_KEEPALIVE ? s->keepalive_timeout
		             : kind == TIMER_LINGER ? LINGER_SECONDS
		             : kind == TIMER_PING ? s->ws_ping_interval
		             : kind == TIMER_PONG ? s->ws_ping_timeout : s->body_timeout;

		timer_cancel(c);
		if (dur <= 0)
			return;                          /* 0: no timeout of that kind */
		c->tkind = kind;
		c->due = mono_now() + dur;
	}
	c->tpos = c->pos;
	l = list_of(c);
	after = l->tail;
	while (after && after->due > c->due)
		after = after->tprev;
	c->tprev = after;
	c->tnext = after ? after->tnext : l->head;
	if (c->tnext)
		c->tnext->tprev = c;
	else
		l->tail = c;
	if (after)
		after->tnext = c;
	else
		l->head = c;
}

/* A deadline that is not now + the kind's duration (a body's pushed back
 * by what arrived, a ping's from the last input): c's timer of kind due
 * at due. A due later than the list's tail goes at its end (O(1)); an
 * earlier one walks back from the tail to its place. */
void timer_arm_at(struct conn *c, int kind, double due)
{
	if (c->tkind == kind && c->due == due)
		return;
	timer_cancel(c);
	c->tkind = kind;
	c->due = due;
	timer_arm(c, -1);
}

/* ms until the thread's next deadline, or -1 */
int timers_timeout(struct srv_thread *t, double now)
{
	double next = -1;

	for (int k = 0; k < TIMER_KINDS; k++) {
		struct conn *h = t->timers[k].head;
		if (h && (next < 0 || h->due < next))
			next = h->due;
	}
	if (next < 0)
		return -1;
	return next <= now ? 0 : (int)((next - now) * 1000) + 1;
}

