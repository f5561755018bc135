/* sockherd fdcore: the fd table, its lifecycle and the running protocol.
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
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fd-int.h"

const char *fdc_version(void)
{
	return "1";
}

/* ---- table ---- */

void fdc_table_free(struct fdc_table *t)
{
	if (!t)
		return;
	if (t->threads) {
		for (int i = 0; i < t->nbthread; i++) {
			struct fdc_thread *th = &t->threads[i];

			if (th->epfd >= 0)
				close(th->epfd);
			if (th->evfd >= 0)
				close(th->evfd);
			free(th->updt);
			free(th->owed);
			free(th->retry);
			free(th->retry_why);
		}
		free(t->threads);
	}
	if (t->probe_epfd >= 0)
		close(t->probe_epfd);
	free(t->fdtab);
	free(t->polled);
	free(t);
}

static int thread_init(struct fdc_table *t, struct fdc_thread *th)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = FDC_WAKE_TOKEN };

	th->updt = malloc(sizeof(*th->updt) * (size_t)t->maxfd);
	/* the retry ring of reports that could not be queued: allocated now,
	 * so that a retry is listed without memory (poller_owed.c, retry_later) */
	th->retry = malloc(sizeof(*th->retry) * (size_t)t->maxfd);
	th->retry_why = calloc((size_t)t->maxfd, sizeof(*th->retry_why));
	if (!th->updt || !th->retry || !th->retry_why)
		return -ENOMEM;
	th->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (th->epfd < 0)
		return -errno;
	th->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (th->evfd < 0)
		return -errno;
	if (epoll_ctl(th->epfd, EPOLL_CTL_ADD, th->evfd, &ev) < 0)
		return -errno;
	return 0;
}

struct fdc_table *fdc_table_new(int maxfd, int nbthread, int nbgroup, int *err)
{
	struct fdc_table *t;
	int per, rem, base = 0, rc;

	if (maxfd <= 0 || nbthread <= 0 || nbgroup <= 0 || nbgroup > FDC_MAX_GROUPS ||
	    nbgroup > nbthread || maxfd > (1 << 30)) {
		*err = -EINVAL;
		return NULL;
	}
	per = nbthread / nbgroup;
	rem = nbthread % nbgroup;
	if (per + (rem ? 1 : 0) > FDC_MAX_GROUP_THREADS) {
		*err = -EINVAL;
		return NULL;
	}

	t = calloc(1, sizeof(*t));
	if (!t) {
		*err = -ENOMEM;
		return NULL;
	}
	t->probe_epfd = -1;   /* fdc_table_free on an early failure must not close fd 0 */
	t->maxfd = maxfd;
	t->nbthread = nbthread;
	t->nbgroup = nbgroup;
	t->fdtab = aligned_alloc(64, sizeof(*t->fdtab) * (size_t)maxfd);
	t->polled = calloc((size_t)maxfd, sizeof(*t->polled));
	t->threads = calloc((size_t)nbthread, sizeof(*t->threads));
	if (!t->fdtab || !t->polled || !t->threads) {
		fdc_table_free(t);
		*err = -ENOMEM;
		return NULL;
	}
	memset(t->fdtab, 0, sizeof(*t->fdtab) * (size_t)maxfd);
	for (int fd = 0; fd < maxfd; fd++)
		atomic_init(&t->fdtab[fd].links, fdc_lmk(FDC_LIST_OUT, FDC_LIST_END));
	for (int i = 0; i < nbthread; i++)
		t->threads[i].epfd = t->threads[i].evfd = -1;
	t->probe_epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->probe_epfd < 0) {
		*err = -errno;
		fdc_table_free(t);
		return NULL;
	}

	for (int g = 1; g <= nbgroup; g++) {
		struct fdc_group *grp = &t->groups[g];

		grp->tgid = g;
		grp->base = base;
		grp->count = per + (g <= rem ? 1 : 0);
		grp->enabled_mask = grp->count == 64 ? ~0ULL : (1ULL << grp->count) - 1;
		atomic_init(&grp->first, FDC_LIST_END);
		atomic_init(&grp->last, FDC_LIST_END);
		for (int l = 0; l < grp->count; l++) {
			struct fdc_thread *th = &t->threads[base + l];

			th->t = t;
			th->tid = base + l;
			th->tgid = g;
			th->ltid = l;
			th->ltid_bit = 1ULL << l;
		}
		base += grp->count;
	}
	for (int i = 0; i < nbthread; i++) {
		rc = thread_init(t, &t->threads[i]);
		if (rc < 0) {
			fdc_table_free(t);
			*err = rc;
			return NULL;
		}
	}
	*err = 0;
	return t;
}

struct fdc_thread *fdc_thread(struct fdc_table *t, int tid)
{
	if (tid < 0 || tid >= t->nbthread)
		return NULL;
	return &t->threads[tid];
}

void fdc_thread_info(const struct fdc_thread *th, int *tgid, int *ltid, int *epfd)
{
	*tgid = th->tgid;
	*ltid = th->ltid;
	*epfd = th->epfd;
}

void fdc_set_hook(struct fdc_table *t, fdc_hook_fn fn, void *arg)
{
	atomic_store(&t->hook_arg, arg);
	atomic_store_explicit(&t->hook, fn, memory_order_release);
}

/* ---- insert ---- */

/* What the kernel says fd is, before it enters the table. Returns the
 * insert flags to add (FDC_CLONED for a listening socket, unless the caller
 * vouched with FDC_SOLE that it is open nowhere else), or a negative errno:
 * -EBADF for a number that is not open, -EPERM for a file epoll refuses
 * (regular files, directories, /dev/null and other devices without poll,
 * O_PATH fds, an epoll fd asked EXCLUSIVE): its ADD would fail for ever,
 * and the owner would wait for events that never come.
 * Why listeners are CLONED by default: every sockherd listener is also open
 * in the master (and dup'ed per group), so its close() leaves it registered
 * in every epoll instance of ours that had it: HAProxy's seed 004, four
 * threads spinning on a listener bound to one.
 * Cost: one getsockopt for a socket, which epoll always accepts (the accept
 * path skips even that with FDC_ACCEPTED). Anything else is asked of the
 * kernel itself, an ADD + DEL on the table's scratch epoll instance: no
 * guess by file type (procfs files poll, /dev/null does not).
 */
static int probe_fd(struct fdc_table *t, int fd, uint32_t flags)
{
	/* as the pollers will register it: EPOLLEXCLUSIVE is refused on some
	 * files that plain registration accepts (an epoll fd) */
	struct epoll_event ev = {
		.events = flags & FDC_EXCLUSIVE ? EPOLLIN | EPOLLEXCLUSIVE : 0,
	};
	int listening = 0;
	socklen_t len = sizeof(listening);

	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0)
		return listening && !(flags & FDC_SOLE) ? FDC_CLONED : 0;
	if (errno == EBADF) {
		/* not open, or an O_PATH fd (open, but nothing can poll it) */
		return fcntl(fd, F_GETFD) < 0 ? -EBADF : -EPERM;
	}
	if (epoll_ctl(t->probe_epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		/* EEXIST: another insert of this number is probing it too */
		if (errno == EEXIST)
			return 0;
		return errno == EPERM || errno == EINVAL ? -EPERM : -errno;
	}
	epoll_ctl(t->probe_epfd, EPOLL_CTL_DEL, fd, NULL);
	return 0;
}

int fdc_insert(struct fdc_table *t, int fd, uint64_t owner, uint32_t kind,
               int tgid, uint64_t thread_mask, uint32_t flags)
{
	struct fdc_entry *e;
	int extra, rc;

	if (!fdc_fd_ok(t, fd))
		return -EBADF;
	if (tgid < 1 || tgid > t->nbgroup || !owner || (flags & ~FDC_INSERT_FLAGS))
		return -EINVAL;
	thread_mask &= t->groups[tgid].enabled_mask;
	if (!thread_mask)
		return -EINVAL;
	/* at least one syscall per insert (about 0.4 us here, bench/RESULTS.md):
	 * the accept path, where we know what the fd is, goes without */
	extra = flags & FDC_ACCEPTED ? 0 : probe_fd(t, fd, flags);
	if (extra < 0)
		return extra;
	flags = (flags | (uint32_t)extra) & ~(FDC_SOLE | FDC_ACCEPTED);
	/* SO_LINGER 0 before our close() turns the socket's *last* close into
	 * a reset: for a disowned or cloned fd that close is somebody else's,
	 * later, on a connection still in use (HAProxy sets it regardless) */
	if ((flags & FDC_LINGER_RISK) && (flags & (FDC_DISOWN | FDC_CLONED)))
		return -EINVAL;
	e = &t->fdtab[fd];

	/* claim the entry locked: a verb racing on this number (a stale
	 * handle) cannot land half-way and poison it */
	rc = fdc_tgid_claim(e, tgid);
	if (rc < 0)
		return rc;

	/* I2: a clean entry, else a close did not finish or the caller lies */
	if (atomic_load(&e->owner) || atomic_load(&e->state) ||
	    atomic_load(&e->running_mask) || atomic_load(&e->thread_mask)) {
		fdc_tgid_unclaim(e);
		return -EEXIST;
	}

	/* update_mask and polled masks are not reset: a clean close left them
	 * zero, and clearing a bit someone else set would break I6.
	 */
	atomic_store(&e->kind, kind);
	atomic_store(&e->nb_takeover, 0);
	atomic_store(&e->ctl_errno, 0);
	atomic_store(&e->state, FDC_READY_R | FDC_READY_W | flags);
	atomic_store(&e->thread_mask, thread_mask);
	atomic_store(&e->owner, owner);
	fdc_tgid_publish(e);
	return 0;
}

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

/* Range-checks fd and takes a reference on it whatever its group (any
 * thread). Returns the entry with *tgid set and the reference held, or NULL
 * without one if fd is out of the table or closed.
 */
static struct fdc_entry *take_entry(struct fdc_table *t, int fd, int *tgid)
{
	struct fdc_entry *e;

	if (!fdc_fd_ok(t, fd))
		return NULL;
	e = &t->fdtab[fd];
	*tgid = fdc_take(e);
	return *tgid ? e : NULL;
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

/* ---- listeners across groups ---- */

int fdc_listener_fds(struct fdc_table *t, int fd, uint64_t tgids, int *out)
{
	uint64_t valid = ((1ULL << t->nbgroup) - 1) << 1;
	int n = 0;

	for (int g = 0; g <= FDC_MAX_GROUPS; g++)
		out[g] = -1;
	if (fd < 0 || !tgids || (tgids & ~valid))
		return -EINVAL;
	for (int g = 1; g <= t->nbgroup; g++) {
		if (!(tgids & (1ULL << g)))
			continue;
		if (!n) {
			out[g] = fd;
		}
		else {
			out[g] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
			if (out[g] < 0) {
				int err = -errno;

				for (int h = 1; h < g; h++)
					if (out[h] >= 0 && out[h] != fd)
						close(out[h]);
				for (int h = 0; h <= FDC_MAX_GROUPS; h++)
					out[h] = -1;
				return err;
			}
		}
		n++;
	}
	return n;
}

/* ---- inspection ---- */

int fdc_dump(struct fdc_table *t, int fd, struct fdc_fdinfo *out)
{
	struct fdc_entry *e;
	uint32_t rt;

	if (!fdc_fd_ok(t, fd))
		return -EBADF;
	e = &t->fdtab[fd];
	rt = atomic_load(&e->refc_tgid);
	out->fd = fd;
	out->tgid = rt & FDC_TGID_MASK;
	out->refcount = rt >> 16;
	out->state = atomic_load(&e->state);
	out->generation = atomic_load(&e->generation);
	out->nb_takeover = atomic_load(&e->nb_takeover);
	out->kind = atomic_load(&e->kind);
	out->in_shared_list = fdc_in_shared_list(t, fd);
	out->running_mask = atomic_load(&e->running_mask);
	out->thread_mask = atomic_load(&e->thread_mask);
	out->update_mask = atomic_load(&e->update_mask);
	out->polled_recv = atomic_load(&t->polled[fd].recv);
	out->polled_send = atomic_load(&t->polled[fd].send);
	out->polled_hup = atomic_load(&t->polled[fd].hup);
	out->owner = atomic_load(&e->owner);
	out->ctl_errno = atomic_load(&e->ctl_errno);
	return 0;
}

int fdc_in_shared_list(struct fdc_table *t, int fd)
{
	if (!fdc_fd_ok(t, fd))
		return 0;
	return fdc_lnext(atomic_load(&t->fdtab[fd].links)) >= FDC_LIST_END;
}
