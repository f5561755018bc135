/* sockherd fdcore: an incarnation's lifecycle and the running protocol
 * (enter/leave, delete, takeover, the final close). The rest of the table:
 * fd_table.c (the table, insert, inspection), fd_verbs.c (the direction
 * verbs).
 *
 * Who may touch an fd entry is decided by two things only (fd-t.h):
 *  - a reference on refc_tgid whose tgid matches the caller's group pins the
 *    tgid, hence the meaning of every mask (I1); references last a few
 *    instructions and the final close waits for them to drain;
 *  - a running bit pins the incarnation: nobody closes an fd or takes it
 *    over while another thread is inside. The last thread to drop a running
 *    bit of an fd that lost its owners (thread_mask == 0) closes it.
 *
 * Life of an incarnation:
 *
 *   insert --> owned (thread_mask != 0) --takeover--> owned by the taker
 *                  |                                     |
 *                delete: thread_mask = 0, MUST_CLOSE     |
 *                  v                                     |
 *              orphan --last running bit dropped--> final close --> close()
 *
 * Differences from HAProxy worth knowing:
 *  - the final close DELs a CLONED fd from other threads' epoll instances
 *    *after* the references drained, not before: a poller holding a
 *    reference may be adding the fd to its instance right now, and only once
 *    references are gone is the set of instances final;
 *  - delete takes a reference first and moves thread_mask to 0 by CAS, so a
 *    second delete of the same incarnation cannot re-arm MUST_CLOSE after a
 *    closer consumed it (which would close the number twice);
 *  - takeover stores the new thread_mask by CAS, so a delete racing it wins
 *    instead of being overwritten (HAProxy relies on its idle-list lock);
 *  - a thread leaving an fd it no longer owns decides whether to close on
 *    a fresh read of running_mask after its clear, never on the mask the
 *    clear returned nor on a thread_mask read before it (release_running).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fd-int.h"

/* ---- final close ---- */

/* Performs the close of an orphaned fd. Caller: the unique thread that won
 * MUST_CLOSE as last runner (I4), holding no reference on the fd (we wait
 * for references to drain). th is the caller's context (counters, local
 * list). Keeps I5: the entry is clean before close().
 */
static void close_orphan(struct fdc_thread *th, int fd)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e = &t->fdtab[fd];
	struct fdc_polled *pol = &t->polled[fd];
	uint32_t gen = atomic_load(&e->generation);
	uint32_t st = atomic_load(&e->state);
	int tgid = atomic_load(&e->refc_tgid) & FDC_TGID_MASK;
	struct fdc_group *g = &t->groups[tgid];

	fdc_hook(t, FDC_HK_CLOSE_BEGIN, th->tid, fd, gen);
	if (st & FDC_LINGER_RISK) {
		struct linger nolinger = { .l_onoff = 1, .l_linger = 0 };

		setsockopt(fd, SOL_SOCKET, SO_LINGER, &nolinger, sizeof(nolinger));
	}

	/* grabs fail from now on; wait for the transient holders to leave:
	 * past this point we are alone with the masks */
	fdc_tgid_reset(e);
	fdc_hook(t, FDC_HK_CLOSE_DRAINED, th->tid, fd, gen);

	/* a cloned file description outlives our close(), and so would its
	 * registrations in our epoll instances; a disowned fd is not closed by
	 * us at all: remove them from every instance that has it (polled bits,
	 * which no poller can change any more).
	 */
	if (st & (FDC_CLONED | FDC_DISOWN)) {
		uint64_t m = atomic_load(&pol->recv) | atomic_load(&pol->send);

		while (m) {
			int ltid = __builtin_ctzll(m);

			m &= m - 1;
			epoll_ctl(t->threads[g->base + ltid].epfd, EPOLL_CTL_DEL, fd, NULL);
			fdc_count(th, CTR_CTL_DEL);
		}
	}

	fdc_list_remove(t, g, fd);
	atomic_store(&e->update_mask, 0);
	/* polled entries are 32 bytes, two fds a cache line: store only what
	 * changes, or closes of neighbouring numbers on different cores fight
	 * over the line (measured in bench/RESULTS.md) */
	if (atomic_load(&pol->recv))
		atomic_store(&pol->recv, 0);
	if (atomic_load(&pol->send))
		atomic_store(&pol->send, 0);
	if (atomic_load(&pol->hup))
		atomic_store(&pol->hup, 0);
	atomic_store(&e->running_mask, 0);
	atomic_store(&e->thread_mask, 0);
	/* "update then close" is common: drop our own now-useless entry,
	 * unless the update pass under way counts it among the entries it
	 * walks (a close during the walk: it drops them all by number when
	 * done, and a trim under it ended the pass with nbupdt -1:
	 * tests/c/repro/update_pass_close.c). Left there, the entry costs a
	 * failed grab. */
	if (th->nbupdt > th->nbwalk && th->updt[th->nbupdt - 1] == fd)
		th->nbupdt--;
	atomic_store(&e->owner, 0);
	atomic_store(&e->kind, 0);
	atomic_store(&e->nb_takeover, 0);
	atomic_store(&e->ctl_errno, 0);
	atomic_store(&e->state, 0);
	/* the incarnation is over for fdc_released() from here: a DISOWN
	 * owner may use or close its fd once it sees this */
	atomic_fetch_add(&e->generation, 1);
	fdc_hook(t, FDC_HK_CLOSE_END, th->tid, fd, gen);
	fdc_drop(e);

	/* last: the number may be handed to another thread as soon as this
	 * returns (I5) */
	if (!(st & FDC_DISOWN))
		close(fd);
}

/* ---- running protocol ---- */

/* Drops th's running bit on fd. Caller: th, holding a running bit and a
 * reference on the fd's tgid, which this consumes. Returns FDC_DONE if th is
 * still an owner; otherwise FDC_CLOSED if th performed the deferred close,
 * else FDC_MIGRATED (th's poller is told to drop its registration).
 *
 * Why the close is safe (I4): after clearing our bit we read thread_mask.
 *  - Our bit in it: we are an owner; a delete that orphans the fd after our
 *    read also comes after our clear, so its own read of running_mask (or
 *    the last runner's) no longer sees us and settles the close.
 *  - Our bit not in it: the fd was orphaned or moved. Whether anybody is
 *    still inside is known only from a read of running_mask made *now*: the
 *    mask our clear returned is stale, since another owner may have been
 *    admitted after it (thread_mask still held that owner) and be inside
 *    while a delete orphaned the fd (issue 6, bug 1). A runner admitted
 *    before the orphaning OR'ed its bit before reading a thread_mask with
 *    its bit, so before the orphaning CAS, so before our read of a zero
 *    thread_mask, so before this read of running_mask: we see it. A thread
 *    entering after the orphaning sees thread_mask 0 and leaves through here
 *    too. So whoever reads running_mask == 0 after the orphaning may close,
 *    and the one-shot MUST_CLOSE token makes it exactly one of them; the
 *    last runner to clear always reads 0, so somebody closes.
 * (HAProxy reads thread_mask before its clear: a delete between the two is
 * then missed by both sides and the fd is never closed.)
 * Ordering: our clear (RMW) then the thread_mask load, and the running_mask
 * load after that, must stay in this order: seq_cst, never relax them. The
 * entering side relies on the mirror order (fdc_enter).
 */
static int release_running(struct fdc_thread *th, int fd)
{
	struct fdc_entry *e = &th->t->fdtab[fd];
	uint64_t bit = th->ltid_bit;

	atomic_fetch_and(&e->running_mask, ~bit);
	fdc_hook(th->t, FDC_HK_RELEASE_CLEARED, th->tid, fd, 0);
	if (atomic_load(&e->thread_mask) & bit) {
		fdc_drop(e);
		return FDC_DONE;
	}
	if (!atomic_load(&e->running_mask) &&
	    (atomic_fetch_and(&e->state, ~FDC_MUST_CLOSE) & FDC_MUST_CLOSE)) {
		fdc_drop(e);
		close_orphan(th, fd);
		return FDC_CLOSED;
	}
	fdc_program_own_update(th, fd);
	fdc_drop(e);
	return FDC_MIGRATED;
}

int fdc_enter(struct fdc_thread *th, int fd, uint32_t *gen)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e;
	uint64_t bit = th->ltid_bit;
	uint64_t run, tmask;

	if (!fdc_fd_ok(t, fd))
		return FDC_CLOSED;
	e = &t->fdtab[fd];
	if (!fdc_grab(e, th->tgid)) {
		fdc_count(th, CTR_POLL_DROP_FD);
		return FDC_CLOSED;
	}

	/* not an owner (any more): never set a running bit, just have our
	 * poller drop the registration */
	if (!(atomic_load(&e->thread_mask) & bit)) {
		fdc_count(th, CTR_POLL_SKIP_FD);
		fdc_program_own_update(th, fd);
		fdc_drop(e);
		return FDC_MIGRATED;
	}

	fdc_hook(t, FDC_HK_ENTER_OWNER, th->tid, fd, 0);
	/* OR our bit first, unconditionally: from now on a takeover's CAS
	 * 0 -> bit fails. Validating before setting was the ABA of HAProxy's
	 * seed 003 (cd8914bc5).
	 * Ordering: this RMW on running_mask, then the load of thread_mask
	 * below, must stay in this order (seq_cst; never relax either). A
	 * delete orphans with a CAS on thread_mask and then loads running_mask
	 * (delete_foreign, release_running): of two threads that each store
	 * one mask and then load the other, at least one sees the other's
	 * store, so a runner is never missed by a closer.
	 */
	atomic_fetch_or(&e->running_mask, bit);
	fdc_hook(t, FDC_HK_ENTER_RUNNING, th->tid, fd, 0);

	/* consistency loop: a running bit outside thread_mask is a takeover or
	 * delete in progress; wait until it resolves, or leave if it resolved
	 * against us (exiting then is what avoids HAProxy's f98a8c317 livelock).
	 */
	for (;;) {
		run = atomic_load(&e->running_mask) & ~bit;
		tmask = atomic_load(&e->thread_mask);
		if (!(tmask & bit)) {
			fdc_count(th, CTR_POLL_SKIP_FD);
			return release_running(th, fd);
		}
		if (!(run & ~tmask))
			break;
		fdc_hook(t, FDC_HK_ENTER_RETRY, th->tid, fd, 0);
		fdc_relax();
	}
	if (gen)
		*gen = atomic_load(&e->generation);
	/* the running bit now pins the incarnation */
	fdc_drop(e);
	return FDC_DONE;
}

int fdc_leave(struct fdc_thread *th, int fd, uint32_t gen)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e;
	struct fdc_polled *pol;
	uint64_t bit = th->ltid_bit;
	uint32_t st;

	if (!fdc_fd_ok(t, fd))
		return FDC_CLOSED;
	e = &t->fdtab[fd];
	pol = &t->polled[fd];
	/* the handler may have deleted the fd: then it is closed (grab fails),
	 * or re-inserted (another generation), or still waiting for another
	 * runner, and our own delete already dropped our running bit.
	 */
	if (!fdc_grab(e, th->tgid))
		return FDC_CLOSED;
	if (atomic_load(&e->generation) != gen || !(atomic_load(&e->running_mask) & bit)) {
		fdc_drop(e);
		return FDC_CLOSED;
	}

	/* still registered in a direction nobody wants (the handler stopped it,
	 * or the report came for an inactive direction): have our poller fix it.
	 * Not an FDC_EDGE fd: its registration is never narrowed (poller.c),
	 * and an update per report would cost every leave a list append */
	st = atomic_load(&e->state);
	if (!(st & FDC_EDGE) &&
	    (((atomic_load(&pol->recv) & bit) && !(st & (FDC_ACTIVE_R | FDC_WATCH_HUP))) ||
	     ((atomic_load(&pol->send) & bit) && !(st & FDC_ACTIVE_W))))
		fdc_program_own_update(th, fd);

	fdc_hook(t, FDC_HK_LEAVE, th->tid, fd, gen);
	return release_running(th, fd);
}

/* ---- delete ---- */

/* Moves thread_mask to 0 and arms MUST_CLOSE, once per incarnation: only
 * the caller that performs the transition arms the token. Caller holds a
 * reference. Returns 1 if it did, 0 if the fd was already orphaned.
 */
static int orphan(struct fdc_entry *e)
{
	uint64_t tmask = atomic_load(&e->thread_mask);

	do {
		if (!tmask)
			return 0;
	} while (!atomic_compare_exchange_weak(&e->thread_mask, &tmask, 0));
	atomic_fetch_or(&e->state, FDC_MUST_CLOSE);
	return 1;
}


/* Delete by a thread of another group than the fd's: it has no running bit
 * to vote with (masks hold the fd group's bits). Orphans the fd, then closes
 * it only if nobody of its group is inside; otherwise the last runner, which
 * sees thread_mask 0 and then reads running_mask (release_running), closes.
 * Either order of our running_mask read and a runner's clear + read ends
 * with exactly one MUST_CLOSE winner.
 * Ordering: the orphaning CAS on thread_mask, then the running_mask load:
 * seq_cst, in this order (the mirror of fdc_enter's OR-then-load).
 * Caller holds a reference (take_entry), which this consumes.
 * Returns 1 if closed now, 0 if deferred.
 */
static int delete_foreign(struct fdc_thread *th, struct fdc_entry *e, int fd)
{
	orphan(e);
	if (!atomic_load(&e->running_mask) &&
	    (atomic_fetch_and(&e->state, ~FDC_MUST_CLOSE) & FDC_MUST_CLOSE)) {
		fdc_drop(e);
		close_orphan(th, fd);
		return 1;
	}
	fdc_drop(e);
	return 0;
}

/* Delete by a thread of the fd's group: count ourselves as a user, orphan
 * the fd so nobody new enters, then leave like any runner: never wait for
 * the others (seed 002). Caller holds a reference, which this consumes.
 * Returns 1 if closed now, 0 if deferred.
 */
static int delete_local(struct fdc_thread *th, struct fdc_entry *e, int fd)
{
	atomic_fetch_or(&e->running_mask, th->ltid_bit);
	orphan(e);
	fdc_hook(th->t, FDC_HK_DELETE_ORPHANED, th->tid, fd, 0);
	return release_running(th, fd) == FDC_CLOSED;
}

int fdc_delete(struct fdc_thread *th, int fd)
{
	struct fdc_entry *e;
	int tgid;

	e = take_entry(th->t, fd, &tgid);
	if (!e)
		return -EBADF;
	return tgid == th->tgid ? delete_local(th, e, fd) : delete_foreign(th, e, fd);
}

int fdc_released(struct fdc_table *t, int fd, uint32_t gen)
{
	if (!fdc_fd_ok(t, fd))
		return -EBADF;
	return atomic_load(&t->fdtab[fd].generation) != gen;
}

/* ---- takeover ---- */

int fdc_takeover(struct fdc_thread *th, int fd, uint64_t expected_owner)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e;
	uint64_t bit = th->ltid_bit;
	uint64_t zero = 0, tmask;
	int moved = 0, r;

	if (!fdc_fd_ok(t, fd))
		return -EBADF;
	e = &t->fdtab[fd];
	if (atomic_load(&e->owner) != expected_owner || !fdc_grab(e, th->tgid))
		return -ESTALE;
	/* owner again under the reference: the fd may have been closed and
	 * reused between the first look and the grab (ABA guard) */
	if (atomic_load(&e->owner) != expected_owner) {
		fdc_drop(e);
		return -ESTALE;
	}
	/* A group-shared connection (fdc_insert_shared) is polled exclusive
	 * and edge-triggered by each owner: the kernel offers an arrival to
	 * the first registration with a sleeper and no other, and reports it
	 * once. Narrowed to us, an old owner asleep before its poller dropped
	 * its registration would take the arrival, find its bit gone, and we
	 * would never hear of those bytes (tests/c/repro/shared_takeover.c).
	 * Nothing to take over either: it is its group's already. (The flag
	 * is set by fdc_insert_shared before its first registration.) */
	if (atomic_load(&e->state) & FDC_EDGE) {
		fdc_drop(e);
		return -EINVAL;
	}
	/* be alone inside: if its poller is handling it now, give up */
	if (!atomic_compare_exchange_strong(&e->running_mask, &zero, bit)) {
		fdc_drop(e);
		return -EBUSY;
	}
	fdc_hook(t, FDC_HK_TAKEOVER_OWNED, th->tid, fd, 0);

	/* A taker that is already one owner among several cannot take over:
	 * its running bit lies inside thread_mask, so an owner entering now
	 * passes the consistency loop as if nothing were in progress, and
	 * narrowing thread_mask would strand it inside (I3). Takeover moves an
	 * fd *to* a thread; HAProxy only ever takes single-owner idle fds.
	 */
	tmask = atomic_load(&e->thread_mask);
	if ((tmask & bit) && tmask != bit)
		return release_running(th, fd) == FDC_CLOSED ? -ESTALE : -EINVAL;

	/* ours from here, unless a delete orphaned it first: a CAS, so the
	 * delete is never overwritten */
	if (tmask && atomic_compare_exchange_strong(&e->thread_mask, &tmask, bit)) {
		uint32_t st;

		moved = 1;
		atomic_fetch_add(&e->nb_takeover, 1);
		/* the new owner subscribes to recv again itself (never stop an
		 * fd we failed to take: HAProxy 8d7b51782); the old owner's
		 * poller DELs when it next sees its bit gone. A direction still
		 * wanted (send) must be registered by our poller now: nobody
		 * else will tell it, and want_send would not flip anything.
		 */
		st = atomic_fetch_and(&e->state, ~FDC_ACTIVE_R) & ~FDC_ACTIVE_R;
		/* our own poller too may hold a registration that no longer
		 * matches (we take back an fd we polled before) */
		if ((st & FDC_WANTED) ||
		    ((atomic_load(&t->polled[fd].recv) | atomic_load(&t->polled[fd].send)) & bit))
			fdc_program_own_update(th, fd);
	}
	r = release_running(th, fd);
	if (r == FDC_CLOSED)
		return -ESTALE;   /* a delete came in meanwhile and we closed it */
	if (!moved)
		return -EBUSY;
	fdc_count(th, CTR_FD_TAKEOVER);   /* only takeovers the caller gets */
	return 0;
}
