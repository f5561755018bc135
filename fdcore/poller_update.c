/* sockherd fdcore: the poller's update pass (poller.c tells the epoll
 * facts it relies on): each thread converges its own epoll instance to the
 * desired state of the fds on its local list and its group's shared list,
 * right before it sleeps, and makes the retries its earlier passes listed
 * (poller_owed.c). ctl() and set_polled() are shared with poller_accept.c
 * (poller-int.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>

#include "fd-int.h"
#include "poller-int.h"

/* epoll_ctl on th's own instance. Returns the number of syscalls made and
 * sets *err to 0, or to the errno of a call that leaves the kernel without
 * what we asked. Every failure counts ctl_err.
 *
 * The policy, errno by errno (epoll_ctl(2)):
 *  - ADD answered EEXIST: the number is registered from an earlier life of
 *    the same file description here (HAProxy 752c5cba5): DEL, then ADD
 *    again. Benign, not counted as an error unless the second ADD fails.
 *  - MOD answered ENOENT: the kernel dropped our registration, which it
 *    does only when the file description was released, i.e. the fd was
 *    closed behind the table's back (and the number may hold another file
 *    now). Never re-ADD: it would register a stranger's file under our
 *    incarnation. An error.
 *  - DEL answered ENOENT or EBADF: the same, seen while removing. Nothing is
 *    registered either way, which is what a DEL alone wanted (counted); the
 *    DEL + ADD of an exclusive fd's change stops there (an error, as MOD).
 *  - anything else (ENOMEM, ENOSPC from max_user_watches, EPERM, EINVAL,
 *    ELOOP): an error. The caller (update_fd) puts polled_mask back to what
 *    the kernel has and reports the fd to its owner (fail_fd): a connection
 *    that cannot be polled must be closed and counted, not starved.
 */
int ctl(struct fdc_thread *th, int op, int fd, struct epoll_event *ev, int *err)
{
	static const int idx[4] = { 0, CTR_CTL_ADD, CTR_CTL_DEL, CTR_CTL_MOD };
	int n = 1;

	*err = 0;
	fdc_count(th, idx[op]);
	if (epoll_ctl(th->epfd, op, fd, ev) == 0)
		return n;
	*err = errno;
	if (op == EPOLL_CTL_ADD && *err == EEXIST) {
		epoll_ctl(th->epfd, EPOLL_CTL_DEL, fd, NULL);
		fdc_count(th, CTR_CTL_DEL);
		fdc_count(th, CTR_CTL_ADD);
		n += 2;
		if (epoll_ctl(th->epfd, EPOLL_CTL_ADD, fd, ev) == 0) {
			*err = 0;
			return n;
		}
		*err = errno;
	}
	fdc_count(th, CTR_CTL_ERR);
	return n;
}

static int update_fd(struct fdc_thread *th, int fd);

/* One listed retry (retry_later) of fd, for the reasons `why`: kept edges
 * on ACTIVE directions are taken again (take_kept), a failed
 * registration's report is owed again if the live incarnation still
 * carries FDC_POLL_CTL (sticky until the close), a listener's refused
 * registration is made again if still wanted and missing (update_fd,
 * which lists it again if refused again: the round stops, the back-off
 * grows; its failure reported as any). Nothing if fd was closed,
 * moved to another group, or th is no owner of it any more (a report to a
 * non-owner is dropped by report_owed anyway). Returns 1 if fd is listed
 * again (still no memory, or the registration refused again), else 0. A number reused by a new incarnation
 * th owns gets a spurious but true report at worst (its own kept edges,
 * or its own failure once more). th's thread, in its update pass.
 * Memory ordering: the grab (a seq_cst RMW) pins the tgid (I1); the loads
 * of thread_mask and state are seq_cst, and the take is take_kept's CAS.
 */
static int retry_one(struct fdc_thread *th, int fd, uint8_t why)
{
	struct fdc_entry *e = &th->t->fdtab[fd];
	uint32_t st;

	if (!fdc_grab(e, th->tgid))
		return 0;
	if (atomic_load(&e->thread_mask) & th->ltid_bit) {
		st = atomic_load(&e->state);
		if ((why & FDC_RETRY_KEPT) && (st & FDC_EDGE))
			take_kept(th, fd);
		if ((why & FDC_RETRY_CTL) && (st & FDC_POLL_CTL) &&
		    owe(th, fd, atomic_load(&e->generation), FDC_POLL_ERR | FDC_POLL_CTL) < 0)
			retry_later(th, fd, FDC_RETRY_CTL);
		/* no update bit consumed here: a verb that changes the state
		 * meanwhile programs an update of its own, walked after us */
		if ((why & FDC_RETRY_ADD) && (st & (FDC_EXCLUSIVE | FDC_EDGE)) == FDC_EXCLUSIVE)
			update_fd(th, fd);
	}
	fdc_drop(e);
	return th->retry_why[fd] != 0;
}

/* The update pass's retries of reports that could not be queued
 * (retry_later): the fds listed when it begins, oldest first, each taken
 * off the ring before its attempt (so a failed attempt re-lists it at the
 * tail, for the NEXT pass: the pass always ends, and the ring never holds
 * more than one slot per fd). The first attempt that fails again stops
 * the round: memory is still short, the rest waits for the next pass too.
 * The back-off: th->retry_ms doubles (to FDC_RETRY_MAX_MS) at each round
 * that fails, and is cleared once nothing is listed; poll_round bounds
 * the wait by it, so a thread with nothing else to do retries at growing
 * intervals instead of sleeping through the return of memory, and never
 * wakes itself. th's thread (the ring is th's own: no ordering).
 */
static void retry_owed(struct fdc_thread *th)
{
	int maxfd = th->t->maxfd;

	for (int n = th->nbretry; n > 0; n--) {
		int fd = th->retry[th->retry_head];
		uint8_t why = th->retry_why[fd];

		th->retry_head = (th->retry_head + 1) % maxfd;
		th->nbretry--;
		th->retry_why[fd] = 0;
		if (retry_one(th, fd, why)) {
			th->retry_ms = th->retry_ms * 2 > FDC_RETRY_MAX_MS ?
			               FDC_RETRY_MAX_MS : th->retry_ms * 2;
			break;
		}
	}
	if (!th->nbretry)
		th->retry_ms = 0;
}

static void set_bit(_Atomic uint64_t *m, uint64_t bit, int on)
{
	if (on)
		atomic_fetch_or(m, bit);
	else if (atomic_load(m) & bit)
		atomic_fetch_and(m, ~bit);
}

/* Records th's registration of an fd in polled_mask: recv side r (h: as a
 * hang-up watch alone, no EPOLLIN), send side w. th's own bit only. */
void set_polled(struct fdc_polled *pol, uint64_t bit, int r, int h, int w)
{
	set_bit(&pol->recv, bit, r);
	set_bit(&pol->hup, bit, r && h);
	set_bit(&pol->send, bit, w);
}

/* Converges th's own registration of fd to the desired state (I8): ADD
 * when th owns it and a direction is ACTIVE, MOD when the polled directions
 * differ, DEL when nothing is wanted or th is no longer an owner. An
 * FDC_EDGE fd's registration only grows while th owns it (the essay
 * above): EPOLLIN once registered at all, EPOLLOUT once send was wanted
 * at a pass; and its edges kept on ACTIVE directions are replayed
 * (take_kept). On a failure polled_mask ends up as the kernel has it and
 * the owner is told (ctl, fail_fd). th's thread, holding a reference on
 * the fd's tgid. Returns syscalls made.
 */
static int update_fd(struct fdc_thread *th, int fd)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e = &t->fdtab[fd];
	struct fdc_polled *pol = &t->polled[fd];
	uint64_t bit = th->ltid_bit;
	uint32_t st = atomic_load(&e->state);
	int owner = !!(atomic_load(&e->thread_mask) & bit);
	int excl = !!(st & FDC_EXCLUSIVE);
	int wr = owner && (st & FDC_ACTIVE_R);
	/* hang-up only: registered on the recv side (polled recv) with
	 * EPOLLRDHUP and no EPOLLIN */
	int wh = owner && !wr && !excl && (st & FDC_WATCH_HUP);
	int ww = owner && (st & FDC_ACTIVE_W);
	int pr = !!(atomic_load(&pol->recv) & bit);
	int ph = !!(atomic_load(&pol->hup) & bit);
	int ps = !!(atomic_load(&pol->send) & bit);
	int n, err, kept = 0;   /* kept: the old registration survives a failure */
	struct epoll_event ev;

	if (st & FDC_EDGE) {
		/* never narrowed while th owns it: a DEL + ADD would put th's
		 * instance behind its siblings' in the file's wait queue */
		int any = owner && (pr || ps || wr || ww);

		ww = any && (ps || ww);
		wr = any;
		if (owner && (st & (FDC_KEPT_R | FDC_KEPT_W)))
			take_kept(th, fd);
	}

	/* What the kernel has is what our own polled bits say (only we write
	 * them, and we hold a reference: the final close cannot zero them
	 * under us), the recv side in three kinds: none, EPOLLIN, or a
	 * hang-up watch alone (ph). Compare all three with what is wanted now,
	 * never guess the kind from the state: the state is read once, here,
	 * and the WATCH_HUP that made a watch may be gone by then (want_recv
	 * then stop_hup between two passes: fd-t.h, struct fdc_polled).
	 * Reading the state once is enough: our caller cleared our update bit
	 * before this load (seq_cst), and a verb that changes a WANTED bit
	 * after it sets that bit again after its CAS (change_state), so the
	 * next pass starts from the exact record written here. */
	if ((wr || wh) == pr && wh == ph && ww == ps)
		return 0;
	/* a shared connection still being registered by its inserter: its
	 * polled bits run ahead of the kernel there; the inserter programs
	 * the change once it is done (fdc_insert_shared) */
	if (st & FDC_INSERTING)
		return 0;
	wr = wr || wh;

	/* polled bits first: the final close reads them once references have
	 * drained, and we hold one */
	set_polled(pol, bit, wr, wh, ww);

	if (!wr && !ww)
		return ctl(th, EPOLL_CTL_DEL, fd, NULL, &err);

	ev.events = (wr ? (wh ? 0 : EPOLLIN) | (excl ? 0 : EPOLLRDHUP) : 0) |
	            (ww ? EPOLLOUT : 0) | (excl ? EPOLLEXCLUSIVE : 0) |
	            ((st & FDC_EDGE) ? EPOLLET : 0);
	ev.data.u64 = ((uint64_t)atomic_load(&e->generation) << 32) | (uint32_t)fd;
	if (!pr && !ps) {
		n = ctl(th, EPOLL_CTL_ADD, fd, &ev, &err);
	}
	else if (excl) {
		/* the kernel refuses MOD of an exclusive entry: DEL, then ADD,
		 * in this order (two statements: C leaves the order in which
		 * the operands of + are evaluated unspecified) */
		n = ctl(th, EPOLL_CTL_DEL, fd, NULL, &err);
		/* a refused DEL (ENOENT, EBADF) means our file is gone from
		 * this number: never ADD what holds it now (review finding 2) */
		if (!err)
			n += ctl(th, EPOLL_CTL_ADD, fd, &ev, &err);
	}
	else {
		n = ctl(th, EPOLL_CTL_MOD, fd, &ev, &err);
		kept = err != ENOENT;
	}
	if (err) {
		set_polled(pol, bit, kept && pr, kept && ph, kept && ps);
		fail_fd(th, fd, err);
	}
	return n;
}

/* One walk of the group's shared list, consuming th's bits. th's thread.
 * Returns the epoll_ctl calls made.
 *
 * Why a walk, repeated while the group's removal counter moves (see
 * fdc_update_pass), sees every entry that held th's bit when the pass began:
 *  - The walker holds a reference only while it looks at an entry; it steps
 *    without one. The entry it stands on may meanwhile be removed, closed,
 *    re-inserted (even in another group) and re-added elsewhere, so its
 *    links may lead somewhere else entirely.
 *  - A removed entry keeps its successor in its links (fd-t.h), so a walker
 *    standing on it when it leaves walks on from where it was. What it can
 *    miss is a removal *and re-add* between its arrival and its step: it
 *    then follows the entry's new links (to the tail, or into another list)
 *    and skips what lay between.
 *  - The walker reached that entry by reading a link or `first` that named
 *    it, after reading the counter. The removal changes that link or
 *    `first` after the walker's read, and bumps the counter after that
 *    (fdc_list_remove), so after the walker read the counter. And the
 *    removal bumps before it marks the entry out, i.e. before anybody can
 *    re-add it: a walker that follows the entry's new links after a re-add
 *    has necessarily let the bump happen, sees the counter moved, and
 *    walks again. Entries of another group met on a detour are not grabbed
 *    (tgid mismatch) and only stepped over.
 *  - A walk ends at END; entries added during the walk land at the tail
 *    and wake the threads they are for, so missing one costs no update.
 * The counter is read with seq_cst loads, ordered with the link loads.
 */
static int walk_shared(struct fdc_thread *th, struct fdc_group *g)
{
	struct fdc_table *t = th->t;
	int32_t cur = atomic_load(&g->first);
	int n = 0;

	while (cur >= 0) {
		struct fdc_entry *e = &t->fdtab[cur];
		int32_t next;

		fdc_hook(t, FDC_HK_WALK_ARRIVE, th->tid, cur, 0);
		if (fdc_grab(e, th->tgid)) {
			uint64_t um = atomic_load(&e->update_mask);

			if (um & th->ltid_bit) {
				um = atomic_fetch_and(&e->update_mask, ~th->ltid_bit) & ~th->ltid_bit;
				fdc_hook(t, FDC_HK_UPDATE_CONSUMED, th->tid, cur, 0);
				fdc_done_update(th, g, cur, um);
				if (atomic_load(&e->owner))
					n += update_fd(th, cur);
				else
					fdc_count(th, CTR_POLL_DROP_FD);
			}
			else if (!(um & g->enabled_mask)) {
				/* nobody's update any more (a local pass consumed the
				 * bit): take it off the list, re-checking for a re-arm */
				fdc_done_update(th, g, cur, um);
			}
			fdc_drop(e);
		}

		/* step on: wait out a link being changed; a removed entry tells
		 * which successor it had */
		for (;;) {
			next = fdc_lnext(atomic_load(&e->links));
			if (next != FDC_LIST_LOCKED)
				break;
			fdc_relax();
		}
		if (next <= FDC_LIST_OUT)
			next = -next - 4;
		cur = next;
	}
	return n;
}

/* fd.h. th's update pass, before each wait of fdc_poll (and from
 * local_append when th's local list is full outside a pass): the retries
 * listed by earlier passes (retry_owed), then th's local list, then its
 * group's shared list. Who: th's thread only, never nested (in_pass:
 * local_append traps on a full list inside a pass). Returns the epoll_ctl
 * calls made. Keeps: every update bit of th's set when the pass began is
 * consumed by it (I7), and what the pass itself lists (a retry, an entry
 * a hook appends) is the next pass's, so a pass always ends; the local
 * list loses exactly the nbwalk entries walked, whatever a close on this
 * thread did meanwhile (fd.c, close_orphan). Memory ordering: each update
 * bit is cleared (seq_cst RMW) before update_fd loads the state, the
 * order update_fd's comment relies on; the lists' own in walk_shared and
 * fdc_done_update.
 */
int fdc_update_pass(struct fdc_thread *th)
{
	struct fdc_table *t = th->t;
	struct fdc_group *g = &t->groups[th->tgid];
	int n = 0;

	th->in_pass = 1;
	/* reports that found no memory last time: first, so that what this
	 * pass's walks list again is the next pass's (retry_owed) */
	if (th->nbretry)
		retry_owed(th);

	/* local list: fds th owns alone. Only what it held when the pass
	 * began (nbwalk): what a hook run by the walk appends is the next
	 * pass's, so a pass always ends; and a close run by the walk on this
	 * thread (a hook's delete) leaves those entries alone (fd.c,
	 * close_orphan), so they are exactly the nbwalk dropped below */
	th->nbwalk = th->nbupdt;
	for (int i = 0; i < th->nbwalk; i++) {
		int fd = th->updt[i];
		struct fdc_entry *e = &t->fdtab[fd];

		if (!fdc_grab(e, th->tgid)) {
			fdc_count(th, CTR_POLL_DROP_FD);
			continue;
		}
		atomic_fetch_and(&e->update_mask, ~th->ltid_bit);
		fdc_hook(t, FDC_HK_UPDATE_CONSUMED, th->tid, fd, 0);
		if (atomic_load(&e->owner))
			n += update_fd(th, fd);
		else
			fdc_count(th, CTR_POLL_DROP_FD);
		fdc_drop(e);
	}
	th->nbupdt -= th->nbwalk;
	memmove(th->updt, th->updt + th->nbwalk, sizeof(*th->updt) * (size_t)th->nbupdt);
	th->nbwalk = 0;

	/* shared list: a removal while we walk may carry us past entries (we
	 * stood on one that was removed and re-added at the tail), so walk
	 * again while removals happen; if the list never settles, wake
	 * ourselves so the next wait returns at once and we look again.
	 */
	for (int round = 0; ; round++) {
		uint32_t epoch = atomic_load(&g->epoch);

		n += walk_shared(th, g);
		if (atomic_load(&g->epoch) == epoch)
			break;
		if (round == 3) {
			fdc_wake(t, th->tid);
			break;
		}
	}
	th->in_pass = 0;
	return n;
}
