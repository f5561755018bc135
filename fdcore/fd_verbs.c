/* sockherd fdcore: the direction verbs (want/stop recv, send and the
 * hang-up watch; may/cant recv and send): an fd's desired state, and the
 * poller updates and kept-edge replays a change calls for.
 */
#define _GNU_SOURCE
#include <errno.h>

#include "fd-int.h"

/* ---- direction verbs ---- */

/* The kept edges (FDC_KEPT_*) of the directions a state change old -> new
 * makes ACTIVE. */
static uint32_t kept_of_activated(uint32_t old, uint32_t new)
{
	uint32_t on = new & ~old;

	return old & ((on & FDC_ACTIVE_R ? FDC_KEPT_R : 0) | (on & FDC_ACTIVE_W ? FDC_KEPT_W : 0));
}

/* Whether an FDC_EDGE fd in state st needs an update pass of its owners
 * tm: one of them lacks the registration of a direction ACTIVE in st, or
 * edges are kept on ACTIVE directions (the caller could not take them).
 * Its registration never shrinks (poller.c), so stopping a direction, or
 * wanting one every owner polls already, needs none: no epoll_ctl, no
 * update list, nobody woken. A racy read of other threads' polled bits:
 * at worst one pass too many (a bit cleared under us: its thread's failed
 * registration, reported to it). */
static int edge_needs_pass(struct fdc_table *t, int fd, uint32_t st, uint64_t tm)
{
	struct fdc_polled *pol = &t->polled[fd];

	if ((st & FDC_ACTIVE_R) && (atomic_load(&pol->recv) & tm) != tm)
		return 1;
	if ((st & FDC_ACTIVE_W) && (atomic_load(&pol->send) & tm) != tm)
		return 1;
	return !!(st & ((st & FDC_ACTIVE_R ? FDC_KEPT_R : 0) | (st & FDC_ACTIVE_W ? FDC_KEPT_W : 0)));
}

/* Sets `set` and clears `clr` in the state of fd; programs a poller update
 * if an ACTIVE bit flipped. Any thread; takes its own reference.
 * On an FDC_EDGE fd (a group-shared connection), a caller that is one of
 * its owners takes the kept edges of the directions it activates in the
 * same CAS, and owes itself their report (fdc_replay_kept): the edge came
 * while the direction was not wanted, and will not come again. Another
 * caller leaves them for the owners' update passes (take_kept in
 * poller_owed.c) and wakes the owners: no owner would pass otherwise, as a
 * direction change of an EDGE fd wakes nobody. Returns 0, or -EBADF if fd
 * is not in the table.
 * Memory ordering: the state CAS is seq_cst, as apply_report's: of a
 * report and this CAS, the later one sees the earlier one's bits.
 */
static int change_state(struct fdc_thread *th, int fd, uint32_t set, uint32_t clr)
{
	struct fdc_entry *e;
	uint32_t old, new, took = 0;
	uint64_t tm;
	int tgid, mine;

	e = take_entry(th->t, fd, &tgid);
	if (!e)
		return -EBADF;
	tm = atomic_load(&e->thread_mask);
	mine = tgid == th->tgid && (tm & th->ltid_bit);
	old = atomic_load(&e->state);
	do {
		new = (old | set) & ~clr;
		took = mine ? kept_of_activated(old, new) : 0;
		new &= ~took;
		if (new == old)
			break;
	} while (!atomic_compare_exchange_weak(&e->state, &old, new));
	if (took)
		fdc_replay_kept(th, fd, took);
	if ((old ^ new) & FDC_WANTED) {
		if (!(new & FDC_EDGE))
			fdc_updt_polling(th, fd, tgid);
		else if (edge_needs_pass(th->t, fd, new, tm)) {
			fdc_updt_polling(th, fd, tgid);
			if (!mine && tm)
				fdc_wake_mask(th->t, &th->t->groups[tgid], tm);
		}
	}
	fdc_drop(e);
	return 0;
}

int fdc_want_recv(struct fdc_thread *th, int fd) { return change_state(th, fd, FDC_ACTIVE_R, 0); }
int fdc_stop_recv(struct fdc_thread *th, int fd) { return change_state(th, fd, 0, FDC_ACTIVE_R); }
int fdc_want_send(struct fdc_thread *th, int fd) { return change_state(th, fd, FDC_ACTIVE_W, 0); }
int fdc_stop_send(struct fdc_thread *th, int fd) { return change_state(th, fd, 0, FDC_ACTIVE_W); }
int fdc_want_hup(struct fdc_thread *th, int fd)  { return change_state(th, fd, FDC_WATCH_HUP, 0); }
int fdc_stop_hup(struct fdc_thread *th, int fd)  { return change_state(th, fd, 0, FDC_WATCH_HUP); }
int fdc_may_recv(struct fdc_thread *th, int fd)  { return change_state(th, fd, FDC_READY_R, 0); }
int fdc_cant_recv(struct fdc_thread *th, int fd) { return change_state(th, fd, 0, FDC_READY_R); }
int fdc_may_send(struct fdc_thread *th, int fd)  { return change_state(th, fd, FDC_READY_W, 0); }
int fdc_cant_send(struct fdc_thread *th, int fd) { return change_state(th, fd, 0, FDC_READY_W); }
