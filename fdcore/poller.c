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
 *  - EPOLLEXCLUSIVE instances sharing a file sit in the file's wait queue
 *    in the order they were ADDed, and a wake-up stops at the first one
 *    with a thread asleep in it (earlier ones without a sleeper keep the
 *    report in their ready lists). DEL + ADD puts an instance at the end.
 *    A wake-up for one direction (the socket's EPOLLIN or EPOLLOUT
 *    callback) skips instances registered without it.
 *  - ADD checks readiness at once: a ready file goes on the instance's
 *    ready list and wakes a thread asleep in it. A fresh socket is
 *    writable, so an ADD with EPOLLOUT reports (and wakes) at once.
 *  - With EPOLLET a report comes per wake-up of the file, and carries all
 *    its ready registered events: an arrival reports IN | OUT while the
 *    socket is writable. Measured 2026-11-26 (Linux 6.x): TCP wakes for
 *    EPOLLOUT only once a send found the buffer full (SOCK_NOSPACE), then
 *    once when room came back; AF_UNIX stream wakes for it at every read
 *    by the peer while writable.
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
 *  - a group-shared connection (FDC_EDGE, fdc_insert_shared) is never
 *    DEL + ADDed for a direction change: that would put the accepting
 *    thread's instance behind its siblings' and give its arrivals to them
 *    for the connection's life (the affinity). Its registration only
 *    grows: EPOLLIN | EPOLLOUT in the inserter's instance from the start,
 *    EPOLLIN in its siblings' (an ADD with EPOLLOUT would wake each of
 *    them at every accept), EPOLLOUT added to a sibling's (one DEL + ADD,
 *    the sibling moving behind the others) the first time it passes while
 *    send is wanted. Reports of a direction nobody wants are not handed
 *    out but kept in the state (FDC_KEPT_*, fd-t.h) and replayed to the
 *    thread whose verb wants that direction again, since edge-triggered
 *    epoll will not report them twice. Cost: an AF_UNIX connection's
 *    inserter is told of every read by its peer (dropped, kept);
 *    a TCP one only after a full buffer, when send is wanted anyway;
 *  - a registration the kernel refuses (ENOSPC at max_user_watches, ENOMEM)
 *    is not retried behind the owner's back: polled_mask says what the
 *    kernel really has, and the owner gets an FDC_POLL_CTL report (ctl()).
 *    A listener's (EXCLUSIVE, not EDGE) is the exception: its owner has
 *    nothing to close and no verb re-makes one thread's registration, so
 *    the thread's later update passes make it again, with a back-off, each
 *    failure reported as before (fail_fd; 2026-11-26: a failed requeue had
 *    cost the thread its listener for good).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
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

/* Queues a report th owes its caller about incarnation gen of fd, made by
 * th's next fdc_poll before it waits (report_owed): merged into the one
 * already owed for that incarnation, if any, so a failure and a replay,
 * or two failed attempts, make one report. th's thread (the list is
 * th's own). Returns 0, or -ENOMEM if the list could not grow (nothing
 * queued).
 */
static int owe(struct fdc_thread *th, int fd, uint32_t gen, uint32_t events)
{
	/* owed reports are few and the list short: a scan, not an index */
	for (int i = 0; i < th->nbowed; i++)
		if (th->owed[i].fd == fd && th->owed[i].gen == gen) {
			th->owed[i].events |= events;
			return 0;
		}
	if (th->nbowed == th->capowed) {
		int cap = th->capowed ? 2 * th->capowed : 16;
		struct fdc_owed *p = realloc(th->owed, sizeof(*p) * (size_t)cap);

		if (!p)
			return -ENOMEM;
		th->owed = p;
		th->capowed = cap;
	}
	th->owed[th->nbowed].fd = fd;
	th->owed[th->nbowed].gen = gen;
	th->owed[th->nbowed].events = events;
	th->nbowed++;
	return 0;
}

static int update_fd(struct fdc_thread *th, int fd);

/* Lists fd for a retry (FDC_RETRY_*, fd-t.h): of a report owe() could not
 * queue (no memory), or of a listener's refused registration (fail_fd);
 * made by th's next update pass (retry_owed), not by the walk under way.
 * One entry per fd, whatever walk (local, shared, the retry's own) met it
 * and however often: an fd already listed only gains `why`. Never
 * allocates (the ring has a slot per fd: fd-t.h), so it cannot fail.
 * Nobody is woken: the wait that follows is bounded by th->retry_ms
 * (poll_round), set here to its minimum if no retry was pending. th's
 * thread (the ring is th's own), holding a reference on the fd's tgid
 * (fd < maxfd). Keeps: nbretry == the number of fds whose retry_why is
 * non-zero. Plain memory, th's own: no ordering. */
static void retry_later(struct fdc_thread *th, int fd, uint8_t why)
{
	int maxfd = th->t->maxfd;

	if (th->retry_why[fd]) {
		th->retry_why[fd] |= why;
		return;
	}
	th->retry_why[fd] = why;
	th->retry[(th->retry_head + th->nbretry) % maxfd] = fd;
	th->nbretry++;
	if (!th->retry_ms)
		th->retry_ms = FDC_RETRY_MIN_MS;
}

/* Records that th's registration of fd failed with errno err and queues the
 * fd for a report to its owner by th's next fdc_poll (FDC_POLL_CTL; the
 * report itself is made under a running bit there). Every failed attempt
 * is reported unless a report of this incarnation is already pending on
 * th: a new owner after a takeover, or the owner retrying after a report,
 * hears of its own failure too. If the report cannot be queued (no
 * memory), fd is listed for a retry by a later pass (retry_later): never
 * dropped. th's thread, holding a reference on the fd's tgid (so the
 * generation is the live incarnation's). Memory ordering: the errno is
 * stored before the state's FDC_POLL_CTL (both seq_cst), so whoever sees
 * the flag reads this errno or a later failure's.
 */
static void fail_fd(struct fdc_thread *th, int fd, int err)
{
	struct fdc_entry *e = &th->t->fdtab[fd];
	uint32_t st;

	atomic_store(&e->ctl_errno, err);
	st = atomic_fetch_or(&e->state, FDC_ERR | FDC_POLL_CTL);
	/* out of memory while failing: a later pass tells it (retry_owed).
	 * Dropped, the owner of a connection nobody polls any more waited
	 * for events that never came (tests/c/repro/ctl_report_nomem.c) */
	if (owe(th, fd, atomic_load(&e->generation), FDC_POLL_ERR | FDC_POLL_CTL) < 0)
		retry_later(th, fd, FDC_RETRY_CTL);
	/* a listener (EXCLUSIVE, not a group-shared connection) refused for
	 * want of resources: made again by later passes, with the ring's
	 * back-off. Its owner has nothing to close, and no verb re-makes
	 * th's registration alone: left unpolled, a requeue's ADD that failed
	 * after its DEL (or the want_recv that resumes accepting) cost th
	 * the listener for good, and a worker of one thread every connection
	 * (tests/c/repro/listener_requeue_fail.c). Not for a number whose
	 * file went away (ENOENT, EBADF: never ADD what holds it now), nor a
	 * connection (its owner closes it on the report). */
	if ((st & (FDC_EXCLUSIVE | FDC_EDGE)) == FDC_EXCLUSIVE && (err == ENOSPC || err == ENOMEM))
		retry_later(th, fd, FDC_RETRY_ADD);
}

/* The report a kept edge stands for (fd-t.h, FDC_KEPT_*). */
static uint32_t kept_events(uint32_t kept)
{
	return (kept & FDC_KEPT_R ? FDC_POLL_IN : 0) | (kept & FDC_KEPT_W ? FDC_POLL_OUT : 0);
}

/* fd-int.h. th took the kept edges `kept` (FDC_KEPT_R / FDC_KEPT_W) off
 * the state of FDC_EDGE fd, in the CAS that made their directions ACTIVE
 * (fd.c, change_state) or in its update pass (take_kept): it now owes its
 * caller their report (POLL_IN, POLL_OUT), made by its next fdc_poll
 * before it waits, as the kernel would have made it had the direction
 * been wanted when the edge came.
 * Who: th's thread, an owner of fd in th's group, holding a reference on
 * the fd's tgid (the generation read here is the live incarnation's: it
 * changes only in the final close, which waits for references).
 * Returns nothing: if the report cannot be queued (no memory), the bits
 * go back on the state (ACTIVE and KEPT both set, for once) and fd is
 * listed for a retry (retry_later): th's next update pass takes them
 * again (or another owner's pass does first: take_kept), never the walk
 * under way, and th waits with a back-off meanwhile. Never lost, listed
 * once per fd. Not on an update list: the local walk and the shared
 * walk both met such an entry, and each re-listed it (review of fd3c058:
 * one more local-list copy per pass on an fd shared with a sleeping
 * sibling, th woken at each, until local_append's trap;
 * tests/c/repro/replay_kept_shared_nomem.c).
 * Memory ordering: seq_cst RMW on the state, as every writer of it.
 */
void fdc_replay_kept(struct fdc_thread *th, int fd, uint32_t kept)
{
	struct fdc_entry *e = &th->t->fdtab[fd];

	if (owe(th, fd, atomic_load(&e->generation), kept_events(kept)) == 0)
		return;
	atomic_fetch_or(&e->state, kept);
	retry_later(th, fd, FDC_RETRY_KEPT);
}

/* An update pass's part of the replay: edges kept on directions ACTIVE
 * now, which the verb that activated them could not take (its caller was
 * no owner of fd: fd.c, change_state), are taken by th, which owes their
 * report. th's thread, an owner, holding a reference on the fd's tgid.
 * The CAS takes only bits whose direction is still ACTIVE: one taker per
 * kept edge, whoever it is (a verb, or another owner's pass).
 * Memory ordering: a seq_cst CAS on the state, the word apply_report and
 * change_state CAS too: a kept edge is taken by exactly one of them.
 */
static void take_kept(struct fdc_thread *th, int fd)
{
	struct fdc_entry *e = &th->t->fdtab[fd];
	uint32_t old = atomic_load(&e->state), take;

	do {
		take = old & ((old & FDC_ACTIVE_R ? FDC_KEPT_R : 0) |
		              (old & FDC_ACTIVE_W ? FDC_KEPT_W : 0));
		if (!take)
			return;
	} while (!atomic_compare_exchange_weak(&e->state, &old, old & ~take));
	fdc_replay_kept(th, fd, take);
}

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
static void set_polled(struct fdc_polled *pol, uint64_t bit, int r, int h, int w)
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

/* The report bits that unblock the recv side (READY_R). */
#define FDC_POLL_R_ANY (FDC_POLL_IN | FDC_POLL_PRI | FDC_POLL_HUP | FDC_POLL_ERR | FDC_POLL_RDHUP)

/* Translates an epoll report into FDC_POLL_* bits. */
static uint32_t poll_flags(uint32_t ev)
{
	return (ev & EPOLLIN ? FDC_POLL_IN : 0) | (ev & EPOLLPRI ? FDC_POLL_PRI : 0) |
	       (ev & EPOLLOUT ? FDC_POLL_OUT : 0) | (ev & EPOLLERR ? FDC_POLL_ERR : 0) |
	       (ev & EPOLLHUP ? FDC_POLL_HUP : 0) | (ev & EPOLLRDHUP ? FDC_POLL_RDHUP : 0);
}

/* Records a report in the fd's state: last poll flags (IN/PRI/OUT replaced,
 * the rest sticky), READY for the directions it unblocks, SHUT and ERR;
 * on an FDC_EDGE fd, KEPT for each direction it unblocks that is not
 * ACTIVE (fd-t.h): decided in the same CAS as the verbs' ACTIVE changes
 * (fd.c, change_state), so of a report and a want_* racing, either the
 * report sees ACTIVE (and is handed out: deliverable) or the want sees
 * KEPT (and replays it). Caller holds a running bit. Returns the new state.
 */
static uint32_t apply_report(struct fdc_entry *e, uint32_t flags)
{
	uint32_t old = atomic_load(&e->state), new;

	do {
		new = (old & ~(FDC_POLL_IN | FDC_POLL_PRI | FDC_POLL_OUT)) | flags;
		if (flags & FDC_POLL_R_ANY)
			new |= FDC_READY_R;
		if (flags & (FDC_POLL_OUT | FDC_POLL_ERR))
			new |= FDC_READY_W;
		if (flags & FDC_POLL_RDHUP)
			new |= FDC_SHUT_R;
		if (flags & FDC_POLL_HUP)
			new |= FDC_SHUT_R | FDC_SHUT_W;
		if (flags & FDC_POLL_ERR)
			new |= FDC_ERR;
		if (old & FDC_EDGE) {
			if ((flags & FDC_POLL_R_ANY) && !(old & FDC_ACTIVE_R))
				new |= FDC_KEPT_R;
			if ((flags & (FDC_POLL_OUT | FDC_POLL_ERR)) && !(old & FDC_ACTIVE_W))
				new |= FDC_KEPT_W;
		}
	} while (new != old && !atomic_compare_exchange_weak(&e->state, &old, new));
	return new;
}

/* What of a report recorded by apply_report (new state st) goes to the
 * caller: nothing if no direction is wanted; for an FDC_EDGE fd, whose
 * registration carries directions nobody wants, without IN/PRI while recv
 * is not ACTIVE and without OUT while send is not (apply_report kept
 * them). 0: the report is not handed out. */
static uint32_t deliverable(uint32_t st, uint32_t flags)
{
	if (!(st & FDC_WANTED))
		return 0;
	if (st & FDC_EDGE) {
		if (!(st & FDC_ACTIVE_R))
			flags &= ~(FDC_POLL_IN | FDC_POLL_PRI);
		if (!(st & FDC_ACTIVE_W))
			flags &= ~FDC_POLL_OUT;
	}
	return flags;
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

/* Writes the reports th owes (owe: failed registrations, replayed kept
 * edges) to out[0..max), entering each fd like a poll report (so th holds
 * it). Reports about a closed or moved incarnation, or to a thread no
 * longer an owner, are dropped; so is a replay whose direction was
 * stopped again meanwhile (apply_report keeps it again); those beyond max
 * wait for the next call. th's thread. Returns how many were written.
 * Called before epoll_wait, so a report never waits behind batches that
 * epoll keeps full.
 */
static int report_owed(struct fdc_thread *th, struct fdc_event *out, int max)
{
	struct fdc_table *t = th->t;
	int i, cnt = 0;

	for (i = 0; i < th->nbowed && cnt < max; i++) {
		int fd = th->owed[i].fd;
		uint32_t gen = th->owed[i].gen, flags = th->owed[i].events, held, st;
		struct fdc_entry *e = &t->fdtab[fd];

		if (fdc_enter(th, fd, &held) != FDC_DONE)
			continue;
		if (held != gen) {
			fdc_leave(th, fd, held);
			continue;
		}
		st = apply_report(e, flags);
		/* a failure is told whatever is wanted (I8) */
		if (!(flags & FDC_POLL_CTL))
			flags = deliverable(st, flags);
		if (!flags) {
			fdc_leave(th, fd, gen);
			continue;
		}
		put_event(&out[cnt++], e, fd, gen, flags);
	}
	th->nbowed -= i;
	memmove(th->owed, th->owed + i, sizeof(*th->owed) * (size_t)th->nbowed);
	return cnt;
}

/* Merges an epoll report for fd into the owed report of out[0..nrep)
 * that already holds it, if any: th entered it once, and leaves it once.
 * Returns 1 if merged. th's thread, holding the fd (the report).
 */
static int merge_report(struct fdc_thread *th, struct fdc_event *out, int nrep,
                        int fd, uint32_t gen, uint32_t flags)
{
	for (int j = 0; j < nrep; j++) {
		if (out[j].fd != fd)
			continue;
		if (out[j].gen == gen)
			out[j].events |= deliverable(apply_report(&th->t->fdtab[fd], flags), flags);
		return 1;
	}
	return 0;
}

/* One round of fdc_poll: update pass, owed reports, one epoll_wait, the
 * enter step. Sets *kept_only when the wait brought fd reports, every
 * one of them was an EDGE fd's edge kept for a direction nobody wants
 * (nothing for the caller, nothing wasted either), and no wake-up: a
 * wake-up read here is drained, so waiting on would swallow it (review of
 * the kept edges, finding 1). Sets *retry_timer when the wait was cut
 * short by the back-off of a listed retry (retry_owed) and ended on it,
 * with nothing reported: the caller's timeout is not over. th's thread.
 * Returns as fdc_poll. */
static int poll_round(struct fdc_thread *th, int timeout_ms, struct fdc_event *out, int max,
                      int *kept_only, int *retry_timer)
{
	struct fdc_table *t = th->t;
	struct epoll_event evs[FDC_EVBATCH];
	int n, nrep, cnt, fdev = 0, merged = 0, kept = 0, woken = 0, capped = 0;

	*kept_only = *retry_timer = 0;
	fdc_update_pass(th);
	/* owed reports first (failed registrations, I8; replays); with
	 * reports to make, do not sleep */
	nrep = th->nbowed ? report_owed(th, out, max) : 0;
	cnt = nrep;
	if (cnt == max)
		return cnt;
	if (nrep || th->nbowed)
		timeout_ms = 0;
	/* reports that found no memory are listed (retry_later): sleep no
	 * longer than the back-off, the next round's pass tries again */
	if (th->nbretry && (timeout_ms < 0 || timeout_ms > th->retry_ms)) {
		timeout_ms = th->retry_ms;
		capped = 1;
	}
	fdc_hook(t, FDC_HK_BEFORE_WAIT, th->tid, -1, 0);
	n = epoll_wait(th->epfd, evs, max - cnt, timeout_ms);
	if (n < 0) {
		if (errno != EINTR)
			return cnt ? cnt : -errno;
		/* a signal: the caller's turn (its handlers run), whatever
		 * bounded the wait */
		n = capped = 0;
	}
	*retry_timer = capped && n == 0 && cnt == 0;
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
			woken = 1;
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
		flags = deliverable(st, flags);
		if (!flags) {
			/* an EDGE fd's report of directions not ACTIVE (kept
			 * by apply_report), or nobody wants it (leave programs
			 * the DEL) */
			if (st & FDC_EDGE)
				kept++;
			fdc_leave(th, fd, gen);
			continue;
		}
		put_event(&out[cnt++], e, fd, gen, flags);
	}
	/* woken by fds, and none of their reports reached the caller nor
	 * was kept for it */
	if (fdev && cnt == nrep && !merged && kept != fdev)
		fdc_count(th, CTR_WAKE_NOWORK);
	*kept_only = fdev && kept == fdev && !woken;
	return cnt;
}

static long long mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int fdc_poll(struct fdc_thread *th, int timeout_ms, struct fdc_event *out, int max)
{
	long long until = 0;
	int n, kept_only, retry_timer, kept_rounds = 0;

	if (max <= 0)
		return -EINVAL;
	if (max > FDC_EVBATCH)
		max = FDC_EVBATCH;
	fdc_count(th, CTR_LOOPS);
	if (timeout_ms > 0)
		until = mono_ms() + timeout_ms;   /* a vDSO call, no syscall */
	/* A round whose reports were all kept edges (the ADD of a connection
	 * th just accepted reports it writable; an AF_UNIX peer's every read
	 * does too) has nothing for the caller: wait again, for what is left
	 * of the timeout, rather than hand the caller an empty turn per
	 * accepted connection. Bounded: a caller always gets its turn back.
	 * A round that only waited out a retry's back-off (retry_owed) is no
	 * turn of the caller's either: its timeout goes on. */
	for (;;) {
		n = poll_round(th, timeout_ms, out, max, &kept_only, &retry_timer);
		if (n || !timeout_ms)
			return n;
		if (!retry_timer && (!kept_only || kept_rounds++ == 16))
			return n;
		if (timeout_ms > 0) {
			long long now = mono_ms();

			if (now >= until)
				return 0;
			timeout_ms = (int)(until - now);
		}
	}
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
 * th's with EPOLLOUT besides: no direction change will ever re-register it
 * (update_fd), so it must hold both from the start; its ADD reports the
 * fresh socket writable to th itself, awake here (kept: KEPT_W). The
 * siblings' without: an ADD reporting at once would wake each of them.
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
	ev.data.u64 = ((uint64_t)atomic_load(&e->generation) << 32) | (uint32_t)fd;
	ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLET;
	rest = thread_mask & ~th->ltid_bit;
	for (bit = th->ltid_bit; bit; bit = rest & -rest, rest &= rest - 1) {
		int ltid = __builtin_ctzll(bit);

		atomic_fetch_or(&pol->recv, bit);
		if (bit == th->ltid_bit) {
			atomic_fetch_or(&pol->send, bit);
			ev.events = EPOLLIN | EPOLLOUT | EPOLLEXCLUSIVE | EPOLLET;
			ctl(th, EPOLL_CTL_ADD, fd, &ev, &err);
			if (err) {
				atomic_fetch_and(&pol->recv, ~bit);
				atomic_fetch_and(&pol->send, ~bit);
				fail_fd(th, fd, err);
			}
			ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLET;
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
