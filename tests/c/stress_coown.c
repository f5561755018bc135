/* "coown" scenario: owners entering and leaving the same fd while others
 * take it over and delete it, and the check that nobody closes it under a
 * thread that is inside.
 *
 * A small pool of slots per group (POOL_PER_GROUP, so that threads collide
 * on the same fds all the time), each holding one eventfd inserted for its
 * group. Every thread loops doing, at random:
 *   - fdc_enter() of a slot of its own group by number (a task using its
 *     connection) and, on DONE, the handler below, then fdc_leave();
 *   - with XC_HANDOVER, fdc_takeover() of a slot of its own group (owner
 *     cookie as the ABA guard) and, usually, entering it right away (the
 *     taker uses the connection it took), so takeovers go back and forth
 *     between threads that also enter the fd;
 *   - deleting a slot of any group (so deletes come from owners, from
 *     non-owners of the group and from other groups) and refilling it with a
 *     fresh eventfd: numbers are reused at once;
 *   - writing to a slot's eventfd and wanting / stopping recv, so pollers
 *     get events for it (co-owned fds: every owner's poller at once);
 *   - fdc_poll(0) and the same handler for each event.
 * Slot kinds (-x bits):
 *   XC_SHARED    inserted for 2+ threads of the group: co-owners enter and
 *                leave concurrently while a third thread deletes;
 *   XC_HANDOVER  inserted for one thread, taken over back and forth.
 *   Both (3, the default): half of the slots each way; a non-owner may
 *   then also take over a co-owned fd (it becomes single-owner).
 * The handler, holding the running bit: the usual check_event(), then the
 * test counts itself inside the fd number (g_inside: the close hook fails
 * on a close while it is non-zero), notes the file's identity (fstat),
 * consumes the eventfd, often yields (a delete comes in, a leaver or a
 * former owner runs its release meanwhile), and checks again: the fd is
 * still open and the same file, the test's record still says this
 * incarnation is live, the entry still has our generation, owner and
 * running bit. Then it leaves, and unless it deleted the fd from inside,
 * fdc_leave() may say CLOSED only if this very call closed it (CLOSED
 * otherwise means somebody closed the incarnation while we held it).
 * Now and then the handler deletes the fd itself (it must claim its slot).
 * The protocol paths this aims at (issue 6, bug 1): a leaver that cleared
 * its running bit and is preempted before reading thread_mask, while
 * another owner enters and a third thread deletes; the same after a
 * takeover's release (the fd taken over from the taker, entered, deleted),
 * and through enter's exit path (an owner about to enter while the fd is
 * taken over from it). The hook yields at FDC_HK_ENTER_OWNER and
 * FDC_HK_RELEASE_CLEARED like everywhere else (1 in -w calls); -b adds
 * busy-loop threads so that workers are preempted anywhere.
 * At the end: the quiescent checks (stale registrations of former owners
 * tolerated), every slot deletes with an immediate close, exactly one close
 * per incarnation.
 */
#define _GNU_SOURCE
#include "common.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#define POOL_PER_GROUP 4

struct slot {
	pthread_mutex_t mu;
	int live;               /* 0 while being deleted / refilled */
	int tgid;
	int fd;
	int shared;             /* this slot's incarnations are co-owned */
	uint64_t cookie;
	uint64_t mask0;         /* thread_mask the incarnation was inserted with */
};

static struct slot *g_slots;
static int g_nslots;
static _Atomic uint64_t g_enter_done, g_enter_other, g_held, g_yields;
static _Atomic uint64_t g_take_ok, g_take_busy, g_take_stale, g_take_einval, g_take_closed;
static _Atomic uint64_t g_deletes, g_hdeletes, g_leave_closed;

static void lock(struct slot *s) { CHECK(pthread_mutex_lock(&s->mu) == 0, "lock"); }
static void unlock(struct slot *s) { CHECK(pthread_mutex_unlock(&s->mu) == 0, "unlock"); }

static struct slot *own_slot(struct fdc_thread *th)
{
	return &g_slots[(th->tgid - 1) * POOL_PER_GROUP + (int)rndn(POOL_PER_GROUP)];
}

/* Fills a slot nobody else may touch (live == 0) with a fresh eventfd. */
static void slot_fill(struct fdc_thread *th, struct slot *s)
{
	struct fdc_table *t = g_run.t;
	const struct fdc_group *g = &t->groups[s->tgid];
	uint64_t mask;

	int fd = (int)SYS(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
	if (s->shared && g->count >= 2) {
		/* two or more owners: a random subset, else two random threads */
		mask = rnd() & g->enabled_mask;
		if (!mask || !(mask & (mask - 1))) {
			int a = (int)rndn((unsigned)g->count);
			int b = (a + 1 + (int)rndn((unsigned)g->count - 1)) % g->count;
			mask = 1ull << a | 1ull << b;
		}
	} else
		mask = 1ull << rndn((unsigned)g->count);
	uint64_t ck = tst_insert(fd, KIND_CONN, s->tgid, mask, 0);
	if (chance(2)) {
		int rc = fdc_want_recv(th, fd);
		CHECKFD(fd, rc >= 0, "want_recv: %s", strerror(-rc));
	}
	lock(s);
	s->fd = fd;
	s->cookie = ck;
	s->mask0 = mask;
	s->live = 1;
	unlock(s);
}

/* Claims a live slot for deletion; with `cookie` only that incarnation.
 * Returns 0 if it was not there to claim.
 */
static int slot_claim(struct slot *s, uint64_t cookie, int *fd, uint64_t *ck)
{
	int got = 0;
	lock(s);
	if (s->live && (!cookie || s->cookie == cookie)) {
		s->live = 0;
		*fd = s->fd;
		*ck = s->cookie;
		got = 1;
	}
	unlock(s);
	return got;
}

static void fd_identity(int fd, struct stat *st)
{
	if (fstat(fd, st) < 0)
		FAILFD(fd, "fstat(%d) in a handler holding the running bit: %s (closed under us)", fd,
		       strerror(errno));
}

/* The handler: th holds a running bit on ev->fd (from fdc_enter or
 * fdc_poll). `s` is the slot the fd was reached through (NULL: from a poll;
 * the number may also belong to another slot by now, the cookie tells).
 */
static void handle(struct fdc_thread *th, struct fdc_event *ev, struct slot *s)
{
	int fd = ev->fd;
	struct stat st0, st1;
	uint64_t v;
	struct fdc_fdinfo fi;

	check_event(th, ev);
	atomic_fetch_add(&g_inside[fd], 1);
	atomic_fetch_add_explicit(&g_held, 1, memory_order_relaxed);
	fd_identity(fd, &st0);

	if (read(fd, &v, sizeof(v)) < 0) {
		if (errno != EAGAIN)
			FAILFD(fd, "read eventfd %d: %s", fd, strerror(errno));
		if (ev->events & FDC_POLL_IN) {   /* a co-owner got it first */
			int rc = fdc_cant_recv(th, fd);
			CHECKFD(fd, rc >= 0, "cant_recv: %s", strerror(-rc));
		}
	}
	/* stay inside a while: the window in which a delete arrives and a
	 * thread that left (or lost the fd) decides whether to close */
	if (chance(2)) {
		atomic_fetch_add_explicit(&g_yields, 1, memory_order_relaxed);
		sched_yield();
		if (chance(4))
			sched_yield();
	}

	/* still open, still the same file and incarnation */
	fd_identity(fd, &st1);
	CHECKFD(fd, st0.st_dev == st1.st_dev && st0.st_ino == st1.st_ino,
	        "fd %d changed file while held (ino %lu -> %lu): closed and reused under us", fd,
	        (unsigned long)st0.st_ino, (unsigned long)st1.st_ino);
	CHECKFD(fd, fcntl(fd, F_GETFD) >= 0, "fcntl(F_GETFD): %s", strerror(errno));
	check_event(th, ev);
	CHECKFD(fd, fdc_dump(g_run.t, fd, &fi) >= 0, "dump");
	CHECKFD(fd, fi.tgid == (uint32_t)th->tgid && fi.generation == ev->gen &&
	            fi.owner == ev->owner && (fi.running_mask & th->ltid_bit),
	        "after the yield: tgid %u gen %u owner %#llx running %#llx", fi.tgid, fi.generation,
	        (unsigned long long)fi.owner, (unsigned long long)fi.running_mask);

	/* now and then delete it from inside, through its slot */
	int dfd;
	uint64_t dck;
	if (s && chance(16) && slot_claim(s, ev->owner, &dfd, &dck)) {
		CHECKFD(fd, dfd == fd, "slot claimed for fd %d, holding fd %d", dfd, fd);
		atomic_fetch_sub(&g_inside[fd], 1);   /* delete drops our running bit */
		tst_delete(th, fd, dck);
		atomic_fetch_add(&g_hdeletes, 1);
		tst_leave(th, ev);                    /* CLOSED: nothing held any more */
		slot_fill(th, s);
		return;
	}

	atomic_fetch_sub(&g_inside[fd], 1);
	uint64_t before = tl_closes;
	int rc = tst_leave(th, ev);
	if (rc == FDC_CLOSED) {
		CHECKFD(fd, tl_closes == before + 1,
		        "fdc_leave(fd %d gen %u) = CLOSED but this thread did not close it and its handler"
		        " deleted nothing: the incarnation was closed while we were inside", fd, ev->gen);
		atomic_fetch_add(&g_leave_closed, 1);
	}
}

/* Enters fd by number (outside a poll); handles it on DONE. */
static void enter_and_handle(struct fdc_thread *th, int fd, struct slot *s)
{
	uint32_t gen = 0;
	struct fdc_fdinfo fi;
	int rc = fdc_enter(th, fd, &gen);

	CHECKFD(fd, rc == FDC_DONE || rc == FDC_CLOSED || rc == FDC_MIGRATED, "fdc_enter = %d", rc);
	if (rc != FDC_DONE) {
		atomic_fetch_add_explicit(&g_enter_other, 1, memory_order_relaxed);
		return;
	}
	atomic_fetch_add_explicit(&g_enter_done, 1, memory_order_relaxed);
	/* the running bit pins the incarnation: owner and kind read now are its */
	CHECKFD(fd, fdc_dump(g_run.t, fd, &fi) >= 0, "dump");
	struct fdc_event ev = { .fd = fd, .events = 0, .gen = gen, .kind = fi.kind, .owner = fi.owner };
	handle(th, &ev, s);
}

static void enter_slot(struct fdc_thread *th)
{
	struct slot *s = own_slot(th);

	lock(s);
	int live = s->live, fd = s->fd;
	unlock(s);
	/* outside the lock on purpose: the incarnation may be gone and the
	 * number reused by now (then we enter whatever is there, if ours) */
	if (live)
		enter_and_handle(th, fd, s);
}

static void take_slot(struct fdc_thread *th)
{
	struct slot *s = own_slot(th);

	lock(s);
	int live = s->live, fd = s->fd;
	uint64_t ck = s->cookie, mask0 = s->mask0;
	unlock(s);
	if (!live)
		return;
	int rc = checked_takeover(th, fd, ck, &g_take_closed);
	switch (rc) {
	case -EBUSY: atomic_fetch_add(&g_take_busy, 1); return;
	case -ESTALE: atomic_fetch_add(&g_take_stale, 1); return;
	case -EINVAL:
		CHECKFD(fd, (mask0 & th->ltid_bit) && mask0 != th->ltid_bit,
		        "takeover refused (EINVAL) to tid %d, inserted for %#llx", th->tid,
		        (unsigned long long)mask0);
		atomic_fetch_add(&g_take_einval, 1);
		return;
	}
	CHECKFD(fd, rc == 0, "fdc_takeover(fd %d): %d (%s)", fd, rc, strerror(-rc));
	atomic_fetch_add(&g_take_ok, 1);
	if (chance(4)) {
		/* re-arm recv (takeover stopped it), naming the number only while
		 * the slot says it is still this incarnation */
		lock(s);
		if (s->live && s->cookie == ck) {
			rc = fdc_want_recv(th, fd);
			CHECKFD(fd, rc >= 0, "want_recv after takeover: %s", strerror(-rc));
		}
		unlock(s);
	}
	/* use what we took, racing with the next taker and with deletes */
	if (!chance(4))
		enter_and_handle(th, fd, s);
}

static void delete_slot(struct fdc_thread *th)
{
	struct slot *s = &g_slots[rndn((unsigned)g_nslots)];
	int fd;
	uint64_t ck;

	if (!slot_claim(s, 0, &fd, &ck))
		return;
	tst_delete(th, fd, ck);
	atomic_fetch_add(&g_deletes, 1);
	slot_fill(th, s);
}

static void poke_slot(struct fdc_thread *th)
{
	struct slot *s = &g_slots[rndn((unsigned)g_nslots)];
	uint64_t one = 1;

	lock(s);
	if (s->live) {
		if (write(s->fd, &one, sizeof(one)) < 0)
			FAILFD(s->fd, "write to live eventfd %d: %s", s->fd, strerror(errno));
		int rc = chance(4) ? fdc_stop_recv(th, s->fd) : fdc_want_recv(th, s->fd);
		CHECKFD(s->fd, rc >= 0, "want/stop_recv: %s", strerror(-rc));
	}
	unlock(s);
}

static void *coown_worker(void *arg)
{
	int tid = (int)(intptr_t)arg;
	struct fdc_thread *th = fdc_thread(g_run.t, tid);
	struct fdc_event evs[64];
	int handover = !!(g_opt.extended & XC_HANDOVER);

	seed_thread(tid);
	while (worker_continue(th, 1)) {
		unsigned r = rndn(100);
		if (r < 45)
			enter_slot(th);
		else if (r < 65 && handover)
			take_slot(th);
		else if (r < 75)
			delete_slot(th);
		else if (r < 85)
			poke_slot(th);
		if (chance(2)) {
			int k = fdc_poll(th, 0, evs, 64);
			CHECK(k >= 0, "fdc_poll: %s", strerror(-k));
			for (int i = 0; i < k; i++)
				handle(th, &evs[i], NULL);
		}
	}
	quiescent_point(th, 1);
	return NULL;
}

int run_coown(void)
{
	struct fdc_table *t;
	char extra[384];

	if (!(g_opt.extended & (XC_SHARED | XC_HANDOVER)))
		g_opt.extended |= XC_SHARED | XC_HANDOVER;
	run_init();
	t = g_run.t;
	g_nslots = POOL_PER_GROUP * t->nbgroup;
	g_slots = calloc((size_t)g_nslots, sizeof(*g_slots));
	CHECK(g_slots != NULL, "calloc");
	seed_thread(1000);
	for (int i = 0; i < g_nslots; i++) {
		struct slot *s = &g_slots[i];
		CHECK(pthread_mutex_init(&s->mu, NULL) == 0, "mutex");
		s->tgid = 1 + i / POOL_PER_GROUP;
		switch (g_opt.extended & (XC_SHARED | XC_HANDOVER)) {
		case XC_SHARED: s->shared = 1; break;
		case XC_HANDOVER: s->shared = 0; break;
		default: s->shared = i % 2 == 0;
		}
		slot_fill(fdc_thread(t, 0), s);
	}
	double el = run_threads(coown_worker, NULL);

	snprintf(extra, sizeof(extra),
	         "x=%d busy=%d held=%llu enter_done=%llu enter_other=%llu yields=%llu deletes=%llu"
	         " handler_deletes=%llu leave_closed=%llu take_ok=%llu take_busy=%llu take_stale=%llu"
	         " take_einval=%llu take_closed=%llu",
	         g_opt.extended, g_opt.busy, (unsigned long long)g_held,
	         (unsigned long long)g_enter_done, (unsigned long long)g_enter_other,
	         (unsigned long long)g_yields, (unsigned long long)g_deletes,
	         (unsigned long long)g_hdeletes, (unsigned long long)g_leave_closed,
	         (unsigned long long)g_take_ok, (unsigned long long)g_take_busy,
	         (unsigned long long)g_take_stale, (unsigned long long)g_take_einval,
	         (unsigned long long)g_take_closed);
	print_counters("coown", el, extra);

	/* no thread polls any more: each delete closes at once */
	for (int i = 0; i < g_nslots; i++) {
		struct slot *s = &g_slots[i];
		CHECK(s->live, "slot %d left half-deleted", i);
		CHECK(tst_delete(fdc_thread(t, 0), s->fd, s->cookie) == 1, "idle delete deferred");
		pthread_mutex_destroy(&s->mu);
	}
	free(g_slots);
	run_fini();
	return 0;
}
