/* The connection layer's dispatch of one connection's poll report and
 * timers (conn_on_events, conn_on_timeout): the TLS step's directions
 * mapped, output flushed, a parked body's turn, a lingering close's input
 * dropped, and the protocol's read through the Server's struct conn_ops
 * (conn.h), the only way up. The fd, the output and the input are
 * conn_io.c's.
 *
 * May call: conn_io.c, conn_timers.c; above only through struct conn_ops.
 */
#include "server.h"
#include "conn_io_int.h"

/* ---- events ---------------------------------------------------------------------------------- */

#define EV_INPUT (FDC_POLL_IN | FDC_POLL_HUP | FDC_POLL_RDHUP)

/* A group-shared connection (dispatch.c) is polled edge-triggered: input
 * is announced once, so input met while c does not read (a parked body,
 * output past HIGH_WATER: conn_reading) is remembered here, and
 * sync_dirs replays it as a report (c->missed) once reading is back on.
 * fdcore keeps such an edge itself only when recv was not ACTIVE as the
 * report came (FDC_KEPT_R); a report taken while it still was (a sibling
 * polled it while c's thread was in the app, before the response parked),
 * or a read stopped with bytes left in the socket (its room filled, then
 * a request parked), is this layer's to keep: no edge will come for it
 * (the kernel repeats an EPOLLIN only in a report of its own, and a body
 * the kernel takes without refusing bytes brings none). A replay that
 * finds nothing costs one read (EAGAIN). */
static void keep_input(struct conn *c)
{
	if (c->srv->dispatch && !c->closed && !conn_reading(c))
		c->in_kept = 1;
}

int conn_on_events(struct conn *c, uint32_t events)
{
	int rc;

	c->last_active = mono_now();
	if (events & EV_FIRST)
		return c->srv->ops->serve_first(c);
	if (c->ssl) {
		/* the directions a TLS step waits for are not its own: a read
		 * waiting for room, a write waiting for input (conn_tls.c) */
		if (c->tls_rw && (events & FDC_POLL_OUT))
			events |= FDC_POLL_IN;
		if (c->tls_wr && (events & EV_INPUT))
			events |= FDC_POLL_OUT;
	}
	if (events & FDC_POLL_ERR) {             /* with POLL_CTL: not registered */
		conn_fail(c);
		return 0;
	}
	if ((events & FDC_POLL_OUT) && conn_pending(c))
		conn_flush(c);
	/* a call's send() may wait for the output to drain: its turn, and
	 * the input is read below as for any report (its body, its end) */
	if (c->call && !c->closed && (events & FDC_POLL_OUT) && c->srv->ops->resume(c) < 0)
		return -1;
	if (c->parked && !c->closed && (events & FDC_POLL_OUT)) {
		unsigned long long before;

		if (events & EV_INPUT)
			keep_input(c);                    /* read once the body ended */
		/* edge-triggered (a shared connection, dispatch.c): a POLLOUT
		 * comes again only after the kernel was full; a resume whose
		 * writes it all took must go on while it makes progress */
		do {
			before = c->wrote;
			rc = c->srv->ops->resume(c);
		} while (rc == 0 && c->srv->dispatch && c->parked && !c->closed &&
		         !conn_pending(c) && c->wrote != before);
		return rc;
	}
	if (c->lingering) {
		if (!c->closed && (events & EV_INPUT))
			discard(c);
		return 0;
	}
	if (!(events & EV_INPUT) || c->closed)
		return 0;
	if (!conn_reading(c)) {
		keep_input(c);
		return 0;
	}
	rc = c->srv->ops->readable(c);
	if (rc == 0)
		keep_input(c);          /* reading stopped under it: bytes may be left */
	return rc;
}

int conn_on_timeout(struct conn *c, int kind)
{
	if (c->closed || c->serving)
		return 0;
	if (c->lingering || kind == TIMER_SEND || kind == TIMER_LINGER) {
		/* lingering: it had its time to read the answer; send: it took
		 * nothing of its output for body_timeout (and a soft close would
		 * wait for that output forever) */
		conn_fail(c);
		return 0;
	}
	return c->srv->ops->timeout(c, kind);     /* header, keep-alive, body: the protocol's */
}
