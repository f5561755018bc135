/* sockherd fdcore: one epoll poller per thread. This file: the wait and
 * the dispatch of its reports (fdc_poll). The rest of the poller:
 * poller_update.c (the update pass that converges th's registrations, and
 * its retries), poller_owed.c (the reports th owes its caller, the retry
 * ring), poller_accept.c (accept, a group-shared connection's
 * registrations, a listener's requeue); poller-int.h between them.
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
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "fd-int.h"

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
 * (fd_verbs.c, change_state), so of a report and a want_* racing, either the
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

void fdc_counters(const struct fdc_thread *th, struct fdc_counters *out)
{
	uint64_t *dst = (uint64_t *)out;

	for (int i = 0; i < FDC_NCOUNTERS; i++)
		dst[i] = atomic_load_explicit(&((struct fdc_thread *)th)->ctr.v[i],
		                              memory_order_relaxed);
}
