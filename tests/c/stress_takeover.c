/* "takeover" scenario: idle connections stolen between threads.
 *
 * A pool of slots per group, each holding one connection (a socketpair end
 * inserted for a single thread of the group, recv wanted; the peer end stays
 * with the test). Every thread loops doing, at random:
 *   - fdc_takeover() of a slot of its own group, racing with the owner's
 *     poller, with other takeovers and with deletes (the owner cookie, unique
 *     per incarnation, is the ABA guard); on success it re-arms recv;
 *   - writing a byte to a slot's peer, so that the current or a former
 *     owner's poller reports it;
 *   - want/stop recv on any slot, from any group;
 *   - deleting a slot's connection (from any group) and refilling the slot
 *     with a fresh socketpair, so fd numbers are reused at once;
 *   - polling, and in each handler checking that it holds the running bit,
 *     is in thread_mask (or the fd was deleted meanwhile), and that the
 *     event is about the incarnation the test inserted.
 * The slot mutex only orders the test's own uses of an fd *number* outside
 * a handler (a want_recv must not land on a reused number); takeovers and
 * deletes themselves run outside it and race freely.
 * At the end: successful takeovers == sum of the fd_takeover counters, the
 * quiescent checks (stale registrations of former owners tolerated), and
 * exactly one close per incarnation.
 * Extensions (-x bits), the paths of two core bugs this stress found (fixed
 * in e2ee5a5, "takeover refuses a co-owner ... registers a still-wanted
 * send for the new owner"):
 *   X_COOWNED  a third of the connections are inserted for several threads
 *              of the group: the taker may be a co-owner, which must now be
 *              refused with -EINVAL (it used to succeed while another owner
 *              was inside: handler on a thread outside thread_mask);
 *   X_SEND     send is wanted/stopped too, and a taker sometimes re-arms
 *              send alone: an inherited ACTIVE_W must reach the taker's
 *              poller (it used to be polled by nobody: update lost).
 */
#define _GNU_SOURCE
#include "common.h"

#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#define POOL_PER_GROUP 24

struct slot {
	pthread_mutex_t mu;
	int live;               /* 0 while being deleted / refilled */
	int tgid;
	int fd, peer;
	uint64_t cookie;
	uint64_t mask0;         /* thread_mask the incarnation was inserted with */
};

static struct slot *g_slots;
static int g_nslots;
static _Atomic uint64_t g_take_ok, g_take_busy, g_take_stale, g_take_einval;
/* -ESTALE results of takeover calls that performed the final close: a
 * delete orphaned the fd while we held the running bit, so the close fell to
 * us. fdc_takeover may already have counted fd_takeover for those.
 */
static _Atomic uint64_t g_take_closed;

static void lock(struct slot *s) { CHECK(pthread_mutex_lock(&s->mu) == 0, "lock"); }
static void unlock(struct slot *s) { CHECK(pthread_mutex_unlock(&s->mu) == 0, "unlock"); }

/* Fills a slot nobody else may touch (live == 0) with a fresh connection
 * owned by one random thread of the slot's group.
 */
static void slot_fill(struct fdc_thread *th, struct slot *s)
{
	struct fdc_table *t = g_run.t;
	int sv[2];

	SYS(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv));
	uint64_t en = t->groups[s->tgid].enabled_mask;
	uint64_t mask = 1ull << rndn((unsigned)t->groups[s->tgid].count);
	uint64_t shared = rnd() & en;
	if ((g_opt.extended & X_COOWNED) && chance(3) && shared)
		mask = shared;   /* co-owned */
	uint64_t ck = tst_insert(sv[0], KIND_CONN, s->tgid, mask, 0);
	int rc = fdc_want_recv(th, sv[0]);
	CHECKFD(sv[0], rc >= 0, "want_recv: %s", strerror(-rc));
	lock(s);
	s->fd = sv[0];
	s->peer = sv[1];
	s->cookie = ck;
	s->mask0 = mask;
	s->live = 1;
	unlock(s);
}

/* Claims a live slot for deletion; returns 0 if someone else got it. */
static int slot_claim(struct slot *s, int *fd, int *peer, uint64_t *ck)
{
	int got = 0;
	lock(s);
	if (s->live) {
		s->live = 0;
		*fd = s->fd;
		*peer = s->peer;
		*ck = s->cookie;
		got = 1;
	}
	unlock(s);
	return got;
}

static void try_takeover(struct fdc_thread *th)
{
	struct fdc_table *t = g_run.t;
	int per = POOL_PER_GROUP;
	struct slot *s = &g_slots[(th->tgid - 1) * per + (int)rndn((unsigned)per)];
	int fd;
	uint64_t ck, mask0;

	lock(s);
	int live = s->live;
	fd = s->fd;
	ck = s->cookie;
	mask0 = s->mask0;
	unlock(s);
	if (!live)
		return;
	/* outside the lock on purpose: the incarnation may be deleted, closed
	 * and the number reused by now; the cookie must make that fail.
	 */
	int rc = checked_takeover(th, fd, ck, &g_take_closed);
	if (rc == -EBUSY) {
		atomic_fetch_add(&g_take_busy, 1);
		return;
	}
	if (rc == -ESTALE) {
		atomic_fetch_add(&g_take_stale, 1);
		return;
	}
	if (rc == -EINVAL) {
		/* refused to a co-owner: the owner matched, so this is the
		 * incarnation we looked at, and it must have been inserted
		 * shared with us (once taken over it is owned by one thread) */
		CHECKFD(fd, (mask0 & th->ltid_bit) && mask0 != th->ltid_bit,
		        "takeover refused (EINVAL) to tid %d, inserted for %#llx", th->tid,
		        (unsigned long long)mask0);
		atomic_fetch_add(&g_take_einval, 1);
		return;
	}
	CHECKFD(fd, rc >= 0, "fdc_takeover(fd %d): %d (%s)", fd, rc, strerror(-rc));
	atomic_fetch_add(&g_take_ok, 1);
	lock(s);
	if (s->live && s->cookie == ck) {
		/* not deleted since (deletes claim the slot first): the number is
		 * still this incarnation, we may name it.
		 */
		struct fdc_fdinfo fi;
		CHECKFD(fd, fdc_dump(t, fd, &fi) >= 0, "dump");
		CHECKFD(fd, fi.thread_mask && !(fi.thread_mask & (fi.thread_mask - 1)),
		        "after takeover thread_mask %#llx is not a single thread",
		        (unsigned long long)fi.thread_mask);
		/* re-arm: recv, or with X_SEND sometimes send alone (a reused
		 * backend connection writes its request first) */
		int send_first = (g_opt.extended & X_SEND) && chance(2);
		rc = send_first ? fdc_want_send(th, fd) : fdc_want_recv(th, fd);
		CHECKFD(fd, rc >= 0, "want_recv/send after takeover: %s", strerror(-rc));
	}
	unlock(s);
}

static void handle(struct fdc_thread *th, struct fdc_event *ev)
{
	char b[256];
	ssize_t k;

	check_event(th, ev);
	if (chance(8))
		sched_yield();   /* a busy handler: takeovers must see EBUSY */
	while ((k = recv(ev->fd, b, sizeof(b), 0)) > 0)
		;
	if (k < 0 && errno == EAGAIN) {
		int rc = fdc_cant_recv(th, ev->fd);
		CHECKFD(ev->fd, rc >= 0, "cant_recv: %s", strerror(-rc));
	} else if (k == 0) {
		int rc = fdc_stop_recv(th, ev->fd);   /* peer gone: the deleter is on it */
		CHECKFD(ev->fd, rc >= 0, "stop_recv: %s", strerror(-rc));
	} else if (k < 0 && errno != ECONNRESET)
		FAILFD(ev->fd, "recv: %s", strerror(errno));
	if (ev->events & FDC_POLL_OUT) {
		/* write a little, then stop: a wanted send on a socketpair
		 * reports at every loop */
		if (send(ev->fd, "o", 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN && errno != EPIPE &&
		    errno != ECONNRESET)
			FAILFD(ev->fd, "send: %s", strerror(errno));
		int rc = chance(2) ? fdc_stop_send(th, ev->fd) : fdc_cant_send(th, ev->fd);
		CHECKFD(ev->fd, rc >= 0, "stop/cant_send: %s", strerror(-rc));
	}
	check_event(th, ev);   /* still ours after the I/O */
	tst_leave(th, ev);
}

static void *takeover_worker(void *arg)
{
	int tid = (int)(intptr_t)arg;
	struct fdc_thread *th = fdc_thread(g_run.t, tid);
	struct fdc_event evs[64];

	seed_thread(tid);
	while (worker_continue(th, 1)) {
		unsigned r = rndn(100);
		struct slot *s = &g_slots[rndn((unsigned)g_nslots)];
		if (r < 40) {
			try_takeover(th);
		} else if (r < 65) {
			char b[256];
			lock(s);
			/* the test closes neither end of a live slot: EPIPE means
			 * the core closed our end behind the test's back */
			if (s->live && send(s->peer, "d", 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN)
				FAILFD(s->fd, "send to the peer of live fd %d: %s", s->fd, strerror(errno));
			while (s->live && recv(s->peer, b, sizeof(b), 0) > 0)
				;   /* what handlers sent */
			unlock(s);
		} else if (r < 72) {
			lock(s);
			if (s->live) {
				int (*verb)(struct fdc_thread *, int) = chance(3) ? fdc_stop_recv : fdc_want_recv;
				if ((g_opt.extended & X_SEND) && chance(2))
					verb = chance(2) ? fdc_stop_send : fdc_want_send;
				int rc = verb(th, s->fd);
				CHECKFD(s->fd, rc >= 0, "want/stop_recv: %s", strerror(-rc));
			}
			unlock(s);
		} else if (r < 76) {
			int fd, peer;
			uint64_t ck;
			if (slot_claim(s, &fd, &peer, &ck)) {
				/* peer first half of the time: the HUP then reaches
				 * pollers racing with the delete */
				int early = chance(2);
				if (early)
					SYS(close(peer));
				tst_delete(th, fd, ck);
				if (!early)
					SYS(close(peer));
				slot_fill(th, s);
			}
		}
		int k = fdc_poll(th, chance(64) ? 1 : 0, evs, 64);
		CHECK(k >= 0, "fdc_poll: %s", strerror(-k));
		for (int i = 0; i < k; i++)
			handle(th, &evs[i]);
	}
	quiescent_point(th, 1);
	return NULL;
}

int run_takeover(void)
{
	struct fdc_table *t;
	char extra[256];

	run_init();
	t = g_run.t;
	g_nslots = POOL_PER_GROUP * t->nbgroup;
	g_slots = calloc((size_t)g_nslots, sizeof(*g_slots));
	CHECK(g_slots != NULL, "calloc");
	seed_thread(1000);
	for (int i = 0; i < g_nslots; i++) {
		CHECK(pthread_mutex_init(&g_slots[i].mu, NULL) == 0, "mutex");
		g_slots[i].tgid = 1 + i / POOL_PER_GROUP;
		slot_fill(fdc_thread(t, 0), &g_slots[i]);
	}
	double el = run_threads(takeover_worker, NULL);

	/* every takeover the test saw succeed is one the core counted, and only
	 * those that ended in the deferred close of a deleted fd may be extra */
	uint64_t counted = 0;
	struct fdc_counters c;
	for (int i = 0; i < t->nbthread; i++) {
		fdc_counters(fdc_thread(t, i), &c);
		counted += c.fd_takeover;
	}
	CHECK(counted >= atomic_load(&g_take_ok) &&
	          counted - atomic_load(&g_take_ok) <= atomic_load(&g_take_closed),
	      "fd_takeover counters %llu, successes %llu, closing ESTALEs %llu",
	      (unsigned long long)counted, (unsigned long long)atomic_load(&g_take_ok),
	      (unsigned long long)atomic_load(&g_take_closed));
	snprintf(extra, sizeof(extra),
	         "take_ok=%llu (%.0f/s) take_busy=%llu take_stale=%llu take_einval=%llu take_closed=%llu",
	         (unsigned long long)g_take_ok, (double)g_take_ok / el, (unsigned long long)g_take_busy,
	         (unsigned long long)g_take_stale, (unsigned long long)g_take_einval,
	         (unsigned long long)g_take_closed);
	print_counters("takeover", el, extra);

	/* no thread polls any more: each delete closes at once */
	for (int i = 0; i < g_nslots; i++) {
		struct slot *s = &g_slots[i];
		CHECK(s->live, "slot %d left half-deleted", i);
		CHECK(tst_delete(fdc_thread(t, 0), s->fd, s->cookie) == 1, "idle delete deferred");
		SYS(close(s->peer));
		pthread_mutex_destroy(&s->mu);
	}
	free(g_slots);
	run_fini();
	return 0;
}
