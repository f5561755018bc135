/* sockherd fdcore: one epoll poller per thread.
 *
 * Some facts about epoll (2026-11-22, Linux 6.x; epoll(7), epoll_ctl(2)):
 *  - An interest-list entry is keyed by (open file description, fd number),
 *    not by the number alone. close(fd) removes it only when it was the last
 *    reference to the file description. A file also open in another process
 *    (fork, SCM_RIGHTS) or under another number (dup) stays registered after
 *    our close, and keeps waking us for a number we no longer own.
 *  - One epoll instance shared by threads wakes every thread for every fd
 *    it holds (HAProxy's seed 004: 4 threads spinning for a listener bound
 *    to one of them).
 *  - Level-triggered reports repeat until the condition is consumed, so an
 *    fd registered in a direction nobody wants spins its poller.
 *  - EPOLLEXCLUSIVE (4.5+) wakes one (or a few) of the instances that hold a
 *    file instead of all of them; it is accepted by ADD only (MOD fails with
 *    EINVAL) and only with EPOLLIN/EPOLLOUT/EPOLLWAKEUP/EPOLLET.
 *  - epoll_ctl on an instance is safe from any thread.
 * What this means for us:
 *  - each thread owns one epoll instance and is the only one to ADD/MOD it
 *    (I7); it keeps polled_mask as its cache of what the kernel has;
 *  - the desired state (ACTIVE bits, thread_mask) is authoritative and is
 *    converged to by each owner's update pass right before it sleeps;
 *  - a CLONED fd is DEL'ed from every instance that has it before close
 *    (fd.c, close_orphan), which is why epoll fds live in a shared array;
 *  - epoll data carries (generation << 32 | fd), so a report about an older
 *    incarnation of a reused number is recognised and dropped;
 *  - a shared listener may be registered EXCLUSIVE: changing its directions
 *    then means DEL + ADD;
 *  - a registration the kernel refuses (ENOSPC at max_user_watches, ENOMEM)
 *    is not retried behind the owner's back: polled_mask says what the
 *    kernel really has, and the owner gets an FDC_POLL_CTL report (ctl()).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fd-int.h"

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
static int ctl(struct fdc_thread *th, int op, int fd, struct epoll_event *ev, int *err)
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

/* Records that th's registration of fd failed with errno err and queues the
 * fd for a report to its owner by th's next fdc_poll (FDC_POLL_CTL; the
 * report itself is made under a running bit there). Every failed attempt
 * is reported unless a report of this incarnation is already pending on
 * th: a new owner after a takeover, or the owner retrying after a report,
 * hears of its own failure too. th's thread, holding a reference on the
 * fd's tgid (so the generation is the live incarnation's).
 */
static void fail_fd(struct fdc_thread *th, int fd, int err)
{
	struct fdc_entry *e = &th->t->fdtab[fd];
	uint32_t gen = atomic_load(&e->generation);

	atomic_store(&e->ctl_errno, err);
	atomic_fetch_or(&e->state, FDC_ERR | FDC_POLL_CTL);
	/* failures are rare and the list short: a scan, not an index */
	for (int i = 0; i < th->nbfailed; i++)
		if (th->failed[i].fd == fd && th->failed[i].gen == gen)
			return;
	if (th->nbfailed == th->capfailed) {
		int cap = th->capfailed ? 2 * th->capfailed : 16;
		struct fdc_failed *p = realloc(th->failed, sizeof(*p) * (size_t)cap);

		/* out of memory while failing: the ERR state and ctl_errno stay
		 * on the fd for its owner to see; only the push is lost */
		if (!p)
			return;
		th->failed = p;
		th->capfailed = cap;
	}
	th->failed[th->nbfailed].fd = fd;
	th->failed[th->nbfailed].gen = gen;
	th->nbfailed++;
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
static void set_polled(struct fdc_polled *pol, uint64_t bit, int r, int h, int w)
{
	set_bit(&pol->recv, bit, r);
	set_bit(&pol->hup, bit, r && h);
	set_bit(&pol->send, bit, w);
}

/* Converges th's own registration of fd to the desired state (I8): ADD
 * when th owns it and a direction is ACTIVE, MOD when the polled directions
 * differ, DEL when nothing is wanted or th is no longer an owner. On a
 * failure polled_mask ends up as the kernel has it and the owner is told
 * (ctl, fail_fd). th's thread, holding a reference on the fd's tgid.
 * Returns syscalls made.
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

int fdc_update_pass(struct fdc_thread *th)
{
	struct fdc_table *t = th->t;
	struct fdc_group *g = &t->groups[th->tgid];
	int n = 0;

	th->in_pass = 1;
	/* local list: fds th owns alone; the list may grow while we walk it */
	for (int i = 0; i < th->nbupdt; i++) {
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
	th->nbupdt = 0;

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

/* Translates an epoll report into FDC_POLL_* bits. */
static uint32_t poll_flags(uint32_t ev)
{
	return (ev & EPOLLIN ? FDC_POLL_IN : 0) | (ev & EPOLLPRI ? FDC_POLL_PRI : 0) |
	       (ev & EPOLLOUT ? FDC_POLL_OUT : 0) | (ev & EPOLLERR ? FDC_POLL_ERR : 0) |
	       (ev & EPOLLHUP ? FDC_POLL_HUP : 0) | (ev & EPOLLRDHUP ? FDC_POLL_RDHUP : 0);
}

/* Records a report in the fd's state: last poll flags (IN/PRI/OUT replaced,
 * the rest sticky), READY for the directions it unblocks, SHUT and ERR.
 * Caller holds a running bit. Returns the new state.
 */
static uint32_t apply_report(struct fdc_entry *e, uint32_t flags)
{
	uint32_t old = atomic_load(&e->state), new;

	do {
		new = (old & ~(FDC_POLL_IN | FDC_POLL_PRI | FDC_POLL_OUT)) | flags;
		if (flags & (FDC_POLL_IN | FDC_POLL_PRI | FDC_POLL_HUP | FDC_POLL_ERR | FDC_POLL_RDHUP))
			new |= FDC_READY_R;
		if (flags & (FDC_POLL_OUT | FDC_POLL_ERR))
			new |= FDC_READY_W;
		if (flags & FDC_POLL_RDHUP)
			new |= FDC_SHUT_R;
		if (flags & FDC_POLL_HUP)
			new |= FDC_SHUT_R | FDC_SHUT_W;
		if (flags & FDC_POLL_ERR)
			new |= FDC_ERR;
	} while (new != old && !atomic_compare_exchange_weak(&e->state, &old, new));
	return new;
}

/* Fills one event of a batch; the caller holds a running bit on fd. */
static void put_event(struct fdc_event *ev, struct fdc_entry *e, int fd, uint32_t gen,
                      uint32_t flags)
{
	ev->fd = fd;
	ev->events = flags;
	ev->gen = gen;
	ev->kind = atomic_load(&e->kind);
	ev->owner = atomic_load(&e->owner);
}

/* Writes the reports of th's failed registrations (fail_fd) to out[0..max),
 * entering each fd like a poll report (so th holds it). Reports about a
 * closed or moved incarnation, or to a thread no longer an owner, are
 * dropped; those beyond max wait for the next call. th's thread. Returns
 * how many were written. Called before epoll_wait, so a report never
 * waits behind batches that epoll keeps full.
 */
static int report_failed(struct fdc_thread *th, struct fdc_event *out, int max)
{
	struct fdc_table *t = th->t;
	const uint32_t flags = FDC_POLL_ERR | FDC_POLL_CTL;
	int i, cnt = 0;

	for (i = 0; i < th->nbfailed && cnt < max; i++) {
		int fd = th->failed[i].fd;
		uint32_t gen = th->failed[i].gen, held;
		struct fdc_entry *e = &t->fdtab[fd];

		if (fdc_enter(th, fd, &held) != FDC_DONE)
			continue;
		if (held != gen) {
			fdc_leave(th, fd, held);
			continue;
		}
		apply_report(e, flags);
		put_event(&out[cnt++], e, fd, gen, flags);
	}
	th->nbfailed -= i;
	memmove(th->failed, th->failed + i, sizeof(*th->failed) * (size_t)th->nbfailed);
	return cnt;
}

/* Merges an epoll report for fd into the failure report of out[0..nrep)
 * that already holds it, if any: th entered it once, and leaves it once.
 * Returns 1 if merged. th's thread, holding the fd (the report).
 */
static int merge_report(struct fdc_thread *th, struct fdc_event *out, int nrep,
                        int fd, uint32_t gen, uint32_t flags)
{
	for (int j = 0; j < nrep; j++) {
		if (out[j].fd != fd)
			continue;
		if (out[j].gen == gen) {
			out[j].events |= flags;
			apply_report(&th->t->fdtab[fd], out[j].events);
		}
		return 1;
	}
	return 0;
}

int fdc_poll(struct fdc_thread *th, int timeout_ms, struct fdc_event *out, int max)
{
	struct fdc_table *t = th->t;
	struct epoll_event evs[FDC_EVBATCH];
	int n, nrep, cnt, fdev = 0, merged = 0;

	if (max <= 0)
		return -EINVAL;
	if (max > FDC_EVBATCH)
		max = FDC_EVBATCH;

	fdc_count(th, CTR_LOOPS);
	fdc_update_pass(th);
	/* failed registrations first (I8); with reports to make, do not sleep */
	nrep = th->nbfailed ? report_failed(th, out, max) : 0;
	cnt = nrep;
	if (cnt == max)
		return cnt;
	if (nrep || th->nbfailed)
		timeout_ms = 0;
	fdc_hook(t, FDC_HK_BEFORE_WAIT, th->tid, -1, 0);
	n = epoll_wait(th->epfd, evs, max - cnt, timeout_ms);
	if (n < 0) {
		if (errno != EINTR)
			return cnt ? cnt : -errno;
		n = 0;
	}
	if (n)
		fdc_count(th, CTR_POLL_IO);

	for (int i = 0; i < n; i++) {
		uint64_t data = evs[i].data.u64;
		int fd = (int)(uint32_t)data;
		uint32_t gen = (uint32_t)(data >> 32), held;
		struct fdc_entry *e;
		uint32_t flags, st;

		if (data == FDC_WAKE_TOKEN) {
			uint64_t v;

			if (read(th->evfd, &v, sizeof(v)) < 0) {
				/* EAGAIN: another report of the same wake-up */
			}
			fdc_count(th, CTR_WAKEUPS);
			continue;
		}
		fdev++;
		if (!fdc_fd_ok(t, fd)) {
			fdc_count(th, CTR_POLL_DROP_FD);
			continue;
		}
		e = &t->fdtab[fd];
		/* cheap filter first; the generation read under the running bit
		 * below is the one that counts */
		if (atomic_load(&e->generation) != gen) {
			fdc_count(th, CTR_POLL_STALE);
			continue;
		}
		flags = poll_flags(evs[i].events);
		if (nrep && merge_report(th, out, nrep, fd, gen, flags)) {
			merged++;
			continue;
		}
		if (fdc_enter(th, fd, &held) != FDC_DONE)
			continue;
		if (held != gen) {
			fdc_count(th, CTR_POLL_STALE);
			fdc_leave(th, fd, held);
			continue;
		}
		st = apply_report(e, flags);
		if (!(st & FDC_WANTED)) {
			/* nobody wants it: leave programs the DEL */
			fdc_leave(th, fd, gen);
			continue;
		}
		put_event(&out[cnt++], e, fd, gen, flags);
	}
	/* woken by fds, and none of their reports reached the caller */
	if (fdev && cnt == nrep && !merged)
		fdc_count(th, CTR_WAKE_NOWORK);
	return cnt;
}

int fdc_leave_batch(struct fdc_thread *th, const struct fdc_event *ev, int n)
{
	int closed = 0;

	for (int i = 0; i < n; i++)
		closed += fdc_leave(th, ev[i].fd, ev[i].gen) == FDC_CLOSED;
	return closed;
}

int fdc_wake(struct fdc_table *t, int tid)
{
	uint64_t one = 1;

	if (tid < 0 || tid >= t->nbthread)
		return -EINVAL;
	/* EAGAIN means the counter is saturated: a wake-up is pending anyway */
	if (write(t->threads[tid].evfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		return -errno;
	return 0;
}

int fdc_accept(struct fdc_thread *th, int lfd, int *out, int max)
{
	int n = 0;

	while (n < max) {
		int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (c >= 0) {
			out[n++] = c;
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			if (!n) {
				/* woken for a connection another thread got */
				fdc_count(th, CTR_ACCEPT_EMPTY);
				fdc_cant_recv(th, lfd);
			}
			break;
		}
		if (!n)
			return -errno;
		break;
	}
	fdc_count_n(th, CTR_ACCEPTED, (uint64_t)n);
	return n;
}

/* fd.h. The registrations of a group-shared connection, right after its
 * insert: th's own instance first (the kernel offers an exclusive event to
 * the instances in the order they registered: the accepting thread keeps
 * its connections while it waits, the affinity), then each sibling's.
 * Ordering: each polled bit is set (seq_cst) before its ADD, as update_fd
 * does, and the whole happens under a reference on the fd's tgid, so the
 * final close (which waits for references) sees every bit of an ADD made.
 */
int fdc_insert_shared(struct fdc_thread *th, int fd, uint64_t owner, uint32_t kind,
                      uint64_t thread_mask)
{
	struct fdc_table *t = th->t;
	struct fdc_group *g = &t->groups[th->tgid];
	struct fdc_entry *e;
	struct fdc_polled *pol;
	struct epoll_event ev;
	uint64_t rest, bit;
	int rc, err;

	thread_mask &= g->enabled_mask;
	if (!(thread_mask & th->ltid_bit))
		return -EINVAL;
	rc = fdc_insert(t, fd, owner, kind, th->tgid, thread_mask,
	                FDC_ACCEPTED | FDC_EXCLUSIVE);
	if (rc < 0)
		return rc;
	e = &t->fdtab[fd];
	pol = &t->polled[fd];
	if (!fdc_grab(e, th->tgid))
		return 0;                /* deleted already by a stale handle: its close */
	/* reading is wanted before any poller can report it; INSERTING keeps
	 * other threads' update passes off the fd until every ADD is made */
	atomic_fetch_or(&e->state, FDC_ACTIVE_R | FDC_EDGE | FDC_INSERTING);
	ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLET;
	ev.data.u64 = ((uint64_t)atomic_load(&e->generation) << 32) | (uint32_t)fd;
	rest = thread_mask & ~th->ltid_bit;
	for (bit = th->ltid_bit; bit; bit = rest & -rest, rest &= rest - 1) {
		int ltid = __builtin_ctzll(bit);

		atomic_fetch_or(&pol->recv, bit);
		if (bit == th->ltid_bit) {
			ctl(th, EPOLL_CTL_ADD, fd, &ev, &err);
			if (err) {
				atomic_fetch_and(&pol->recv, ~bit);
				fail_fd(th, fd, err);
			}
			continue;
		}
		fdc_count(th, CTR_CTL_ADD);
		if (epoll_ctl(t->threads[g->base + ltid].epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			/* that sibling does without it: the others still serve */
			atomic_fetch_and(&pol->recv, ~bit);
			fdc_count(th, CTR_CTL_ERR);
		}
	}
	/* a verb that came meanwhile (a stale handle, a test) found its pass
	 * skipped: program it again now that the registrations are real */
	if ((atomic_fetch_and(&e->state, ~FDC_INSERTING) & FDC_WANTED) != FDC_ACTIVE_R)
		fdc_updt_polling(th, fd, th->tgid);
	fdc_drop(e);
	return 0;
}

/* Moves th's registration of an EXCLUSIVE fd to the end of the file's
 * wait queue: DEL, then ADD with the same events and data. The kernel
 * hands an exclusive file's event to the first registered instance that
 * has an idle waiter, so without this the first thread of the first worker
 * to register a listener takes every connection of a light load while the
 * others sleep. A thread that just accepted requeues, and the next
 * connection goes to the poller that waited longest.
 *
 * Who: th's thread, holding fd (its running bit, from fdc_poll or
 * fdc_enter), so no final close can DEL the registration meanwhile (I4,
 * I7). Touches th's own instance only; the desired state, the update lists
 * and the other threads are left alone (a verb pair, stop_recv then
 * want_recv, would make every thread of the group DEL and ADD it and wake
 * them all). Returns 0 (moved); 1 if th does not poll fd for recv as
 * exclusive (nothing to move); -EBADF for an fd out of range; -EPERM if th
 * does not hold fd (or fd is another group's); or -errno of a failed DEL
 * or ADD, after which th polls nothing for fd and the fd is reported like
 * any failed registration (polled bits cleared, FDC_POLL_CTL at th's next
 * poll: I8). It holds a reference on the fd's tgid throughout (I1).
 * Memory ordering: seq_cst loads of running_mask, state, generation and
 * th's polled bits, all stable while th holds fd (only th changes its own
 * polled bits; the generation changes only in the final close).
 */
int fdc_requeue(struct fdc_thread *th, int fd)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e;
	struct fdc_polled *pol;
	uint64_t bit = th->ltid_bit;
	struct epoll_event ev;
	int err;

	if (fd < 0 || fd >= t->maxfd)
		return -EBADF;
	e = &t->fdtab[fd];
	pol = &t->polled[fd];
	/* running bits and polled bits are per group: an fd of another group
	 * (its thread of the same local id may hold it) is not ours (review) */
	if (!fdc_grab(e, th->tgid))
		return -EPERM;
	if (!(atomic_load(&e->running_mask) & bit)) {
		fdc_drop(e);
		return -EPERM;
	}
	if (!(atomic_load(&e->state) & FDC_EXCLUSIVE) || !(atomic_load(&pol->recv) & bit)) {
		fdc_drop(e);
		return 1;
	}
	ev.events = EPOLLIN | EPOLLEXCLUSIVE | ((atomic_load(&pol->send) & bit) ? EPOLLOUT : 0) |
	            ((atomic_load(&e->state) & FDC_EDGE) ? EPOLLET : 0);
	ev.data.u64 = ((uint64_t)atomic_load(&e->generation) << 32) | (uint32_t)fd;
	ctl(th, EPOLL_CTL_DEL, fd, NULL, &err);
	if (!err)
		ctl(th, EPOLL_CTL_ADD, fd, &ev, &err);
	if (err) {
		set_polled(pol, bit, 0, 0, 0);
		fail_fd(th, fd, err);
	}
	fdc_drop(e);
	return err ? -err : 0;
}

void fdc_counters(const struct fdc_thread *th, struct fdc_counters *out)
{
	uint64_t *dst = (uint64_t *)out;

	for (int i = 0; i < FDC_NCOUNTERS; i++)
		dst[i] = atomic_load_explicit(&((struct fdc_thread *)th)->ctr.v[i],
		                              memory_order_relaxed);
}
