/* "listener" scenario: one TCP listener shared by every thread.
 *
 * A loopback listener (127.0.0.1, port 0) is given one fd number per group
 * with fdc_listener_fds() (CLONED, every thread of the group in thread_mask,
 * EXCLUSIVE registration on some epochs). A client thread (not a poller)
 * connects in a loop, sends a byte and closes, sometimes with an RST. The
 * pollers fdc_accept() under the "listener lock" and insert each connection
 * for themselves; a connection is deleted from its own handler at EOF.
 * Meanwhile threads, of any group, stop/want recv on the listener of a
 * random group, and now and then one of them deletes the listener *while
 * holding the listener lock* and opens a new one: a poller inside the
 * accept handler holds the running bit and waits for that lock, so a
 * delete that waited for running bits would deadlock (seed 002); the
 * watchdog turns that into a failure.
 * At the end every thread stops at a barrier, the listeners get a random
 * final state, every thread polls and applies its updates, and the
 * quiescent check asserts that no update was lost: an ACTIVE listener is
 * polled by every thread of its group, an inactive one by none, and the
 * kernel's interest lists agree (a cloned listener closed in one group
 * must have been DEL'ed from that group's epolls).
 */
#define _GNU_SOURCE
#include "common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

static pthread_mutex_t g_lmu = PTHREAD_MUTEX_INITIALIZER;   /* the listener lock */
static int g_lfd[FDC_MAX_GROUPS + 1];
static uint64_t g_lck[FDC_MAX_GROUPS + 1];
static int g_lon[FDC_MAX_GROUPS + 1];       /* recv wanted, per the test */
static _Atomic int g_port;
static _Atomic uint64_t g_connects, g_accepted, g_refused, g_resets, g_lost, g_ldeferred;
static _Atomic uint64_t g_last_reset_ms;
static _Atomic int g_in_accept;   /* pollers in accept_some, running bit held */
static _Atomic uint64_t g_requeue_failed, g_ctl_listener, g_ctl_conn;

static void llock(void) { CHECK(pthread_mutex_lock(&g_lmu) == 0, "lock"); }
static void lunlock(void) { CHECK(pthread_mutex_unlock(&g_lmu) == 0, "unlock"); }

static uint64_t now_ms(void) { return (uint64_t)(now_s() * 1000); }

/* Opens, binds and inserts a new listener for every group. Caller holds
 * the listener lock (or is alone).
 */
static void listener_open(struct fdc_thread *th)
{
	struct fdc_table *t = g_run.t;
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	int one = 1, out[FDC_MAX_GROUPS + 1];
	uint64_t tgids = 0;

	int lfd = (int)SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
	SYS(setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	SYS(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)));
	SYS(listen(lfd, 1024));
	SYS(getsockname(lfd, (struct sockaddr *)&sa, &sl));
	for (int g = 1; g <= t->nbgroup; g++)
		tgids |= 1ull << g;
	int rc = fdc_listener_fds(t, lfd, tgids, out);
	CHECKFD(lfd, rc >= 0, "fdc_listener_fds: %s", strerror(-rc));
	CHECK(out[1] == lfd, "group 1 must get the original fd");
	uint32_t flags = FDC_CLONED | (chance(2) ? FDC_EXCLUSIVE : 0);
	for (int g = 1; g <= t->nbgroup; g++) {
		CHECK(out[g] >= 0 && (g == 1 || out[g] != lfd), "fdc_listener_fds out[%d] = %d", g, out[g]);
		g_lfd[g] = out[g];
		g_lck[g] = tst_insert(out[g], KIND_LISTENER, g, t->groups[g].enabled_mask, flags);
		rc = fdc_want_recv(th, out[g]);
		CHECKFD(out[g], rc >= 0, "want_recv: %s", strerror(-rc));
		g_lon[g] = 1;
	}
	atomic_store(&g_port, ntohs(sa.sin_port));
}

/* A straggler: one group's fd of a replaced listener, deleted only at the
 * next replacement. It keeps the file description open, so the other
 * groups' epoll instances keep their registrations of the closed numbers
 * unless the final close DEL'ed them (CLONED): the kernel check of the
 * quiescent point sees any leftover.
 */
static int g_strag_fd = -1;
static uint64_t g_strag_ck;

static void listener_delete(struct fdc_thread *th, int fd, uint64_t ck)
{
	if (tst_delete(th, fd, ck) == 0)
		atomic_fetch_add(&g_ldeferred, 1);   /* a poller was inside */
}

/* Replaces the listener. Caller holds the listener lock. The old fds are
 * deleted before the new listener opens (immediate reuse of the numbers)
 * or after (the numbers stay free: a registration left behind is then
 * visible to the kernel check). straggle: keep one old group's fd for sure
 * (with several groups) and open first; else each at random.
 */
static void listener_replace(struct fdc_thread *th, int straggle)
{
	int ng = g_run.t->nbgroup;
	int keep = ng > 1 && (straggle || chance(2)) ? 1 + (int)rndn((unsigned)ng) : 0;
	int open_first = straggle || chance(2);
	int old_fd[FDC_MAX_GROUPS + 1];
	uint64_t old_ck[FDC_MAX_GROUPS + 1];

	memcpy(old_fd, g_lfd, sizeof(old_fd));
	memcpy(old_ck, g_lck, sizeof(old_ck));
	if (open_first)
		listener_open(th);
	if (g_strag_fd >= 0)
		listener_delete(th, g_strag_fd, g_strag_ck);
	g_strag_fd = -1;
	for (int g = 1; g <= ng; g++) {
		if (g == keep) {
			g_strag_fd = old_fd[g];
			g_strag_ck = old_ck[g];
		} else
			listener_delete(th, old_fd[g], old_ck[g]);
	}
	if (!open_first)
		listener_open(th);
}

/* What fdc_requeue promises, checked against the kernel (we hold the
 * listener: nobody else changes our instance's registration of it, and
 * its close waits for our leave). Moved (rq 0): our instance holds it,
 * exclusive, with this incarnation's data, and polled_mask says so.
 * Failed (-errno): our instance holds nothing, polled_mask says so, and
 * the failure is ours to report (FDC_POLL_CTL on the state, the report
 * owed or listed for a retry on this thread: I8). */
static void check_requeue(struct fdc_thread *th, struct fdc_event *ev, int rq)
{
	struct fdc_table *t = g_run.t;
	int fd = ev->fd, tgid, ltid, epfd;
	uint64_t data, reg;

	fdc_thread_info(th, &tgid, &ltid, &epfd);
	reg = kernel_registration(epfd, fd, &data);
	int pr = !!(atomic_load(&t->polled[fd].recv) & th->ltid_bit);
	uint32_t st = atomic_load(&t->fdtab[fd].state);

	if (rq == 0) {
		CHECKFD(fd, reg && (reg & EPOLLEXCLUSIVE) && (reg & EPOLLIN) && pr &&
		            data == ((uint64_t)ev->gen << 32 | (uint32_t)fd),
		        "requeued listener fd %d: kernel events %#llx data %#llx, polled %d", fd,
		        (unsigned long long)reg, (unsigned long long)data, pr);
		return;
	}
	CHECKFD(fd, !reg && !pr, "failed requeue of fd %d: kernel events %#llx, polled %d", fd,
	        (unsigned long long)reg, pr);
	CHECKFD(fd, (st & FDC_POLL_CTL) && ctl_report_owed(th, fd, ev->gen),
	        "failed requeue of fd %d (%s) not reported: state %#x ctl_errno %d", fd,
	        strerror(-rq), st, atomic_load(&t->fdtab[fd].ctl_errno));
}

static void accept_some(struct fdc_thread *th, struct fdc_event *ev)
{
	int fds[16];

	/* the accept path takes the listener lock while holding the running
	 * bit: exactly the seed-002 lock order against listener_replace(). The
	 * yield widens the window in which a close finds us inside.
	 */
	atomic_fetch_add(&g_in_accept, 1);
	if (chance(4))
		sched_yield();
	llock();
	atomic_fetch_sub(&g_in_accept, 1);
	int k = fdc_accept(th, ev->fd, fds, 16);
	lunlock();
	if (k == -ECONNABORTED)
		return;
	CHECKFD(ev->fd, k >= 0, "fdc_accept: %s", strerror(-k));
	if (k > 0) {
		/* as the worker does: move our registration to the queue's end
		 * (we hold the listener: its close is deferred to our leave) */
		int rq = fdc_requeue(th, ev->fd);
		/* -e: its ADD made to fail (after its DEL): reported to us by
		 * our next poll (FDC_POLL_CTL), the listener replaced then */
		CHECKFD(ev->fd, rq == 0 || rq == 1 ||
		                (g_opt.epfail && (rq == -ENOMEM || rq == -ENOSPC)),
		        "fdc_requeue: %s", strerror(-rq));
		if (rq < 0)
			atomic_fetch_add(&g_requeue_failed, 1);
		if (rq <= 0 && (rq < 0 || chance(4)))
			check_requeue(th, ev, rq);
	}
	for (int i = 0; i < k; i++) {
		tst_insert(fds[i], KIND_CONN, th->tgid, th->ltid_bit, 0);
		int rc = fdc_want_recv(th, fds[i]);
		CHECKFD(fds[i], rc >= 0, "want_recv: %s", strerror(-rc));
	}
	atomic_fetch_add(&g_accepted, (uint64_t)k);
}

static void conn_io(struct fdc_thread *th, struct fdc_event *ev)
{
	char b[256];
	ssize_t k;

	if (ev->events & FDC_POLL_OUT) {   /* only chaos wants send here */
		int rc = fdc_stop_send(th, ev->fd);
		CHECKFD(ev->fd, rc >= 0, "stop_send: %s", strerror(-rc));
	}
	while ((k = recv(ev->fd, b, sizeof(b), 0)) > 0)
		;
	if (k < 0 && errno == EAGAIN) {
		int rc = fdc_cant_recv(th, ev->fd);
		CHECKFD(ev->fd, rc >= 0, "cant_recv: %s", strerror(-rc));
		return;
	}
	if (k < 0 && errno != ECONNRESET)
		FAILFD(ev->fd, "recv: %s", strerror(errno));
	/* EOF or RST: the connection closes itself from its handler */
	tst_delete(th, ev->fd, ev->owner);
}


static void poll_once(struct fdc_thread *th, int timeout)
{
	struct fdc_event evs[64];
	int k = fdc_poll(th, timeout, evs, 64);

	CHECK(k >= 0, "fdc_poll: %s", strerror(-k));
	for (int i = 0; i < k; i++) {
		check_event(th, &evs[i]);
		if (evs[i].kind == KIND_LISTENER) {
			/* told of our refused registration of it (-e: a requeue's
			 * ADD, an update pass's), as a worker is: accept, nothing
			 * else; fdcore makes it again (the quiescent check: every
			 * owner polls an ACTIVE listener or has it listed for that) */
			if (evs[i].events & FDC_POLL_CTL) {
				ctl_told(evs[i].fd);
				atomic_fetch_add(&g_ctl_listener, 1);
			}
			accept_some(th, &evs[i]);
		}
		else if (evs[i].events & FDC_POLL_CTL) {
			/* our registration of it failed (-e): as a worker, close */
			ctl_told(evs[i].fd);
			atomic_fetch_add(&g_ctl_conn, 1);
			tst_delete(th, evs[i].fd, evs[i].owner);
		}
		else
			conn_io(th, &evs[i]);
		tst_leave(th, &evs[i]);
	}
}

/* stop or want recv on a random group's listener, possibly not ours */
static void toggle(struct fdc_thread *th)
{
	int g = 1 + (int)rndn((unsigned)g_run.t->nbgroup);
	llock();
	int on = g_lon[g] ? !chance(2) : 1;
	int rc = on ? fdc_want_recv(th, g_lfd[g]) : fdc_stop_recv(th, g_lfd[g]);
	CHECKFD(g_lfd[g], rc >= 0, "want/stop_recv(listener): %s", strerror(-rc));
	g_lon[g] = on;
	lunlock();
}

static void *listener_worker(void *arg)
{
	int tid = (int)(intptr_t)arg;
	struct fdc_thread *th = fdc_thread(g_run.t, tid);

	seed_thread(tid);
	while (worker_continue(th, 0)) {
		poll_once(th, chance(8) ? 1 : 0);
		if (chance(16))
			toggle(th);
		uint64_t last = atomic_load(&g_last_reset_ms), now = now_ms();
		if (now - last > 100 && atomic_compare_exchange_strong(&g_last_reset_ms, &last, now)) {
			/* delete under the lock, preferably once a poller holding a
			 * running bit waits for that lock (bounded: 2 ms) */
			llock();
			for (int i = 0; i < 200 && !atomic_load(&g_in_accept); i++)
				usleep(10);
			listener_replace(th, 0);
			lunlock();
			atomic_fetch_add(&g_resets, 1);
		}
	}
	bar_wait(tid);
	if (tid == 0) {
		/* a last replacement leaving a straggler for the kernel check,
		 * and a random final state for the listeners */
		llock();
		listener_replace(th, 1);
		lunlock();
		for (int g = 1; g <= g_run.t->nbgroup; g++)
			if (chance(2))
				toggle(th);
	}
	bar_wait(tid);
	for (int i = 0; i < 3; i++)
		poll_once(th, 0);
	quiescent_point(th, 0);
	return NULL;
}

/* The client: not a poller. Keeps at most 64 connections not yet accepted
 * (a deleted listener's backlog is lost, hence the give-up after 100 ms).
 */
static void *client(void *arg)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	(void)arg;
	seed_thread(999);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	while (!atomic_load(&g_run.stop)) {
		for (int w = 0; atomic_load(&g_connects) - atomic_load(&g_accepted) - atomic_load(&g_lost) >= 64;
		     w++) {
			if (w >= 200 || atomic_load(&g_run.stop)) {
				atomic_store(&g_lost, atomic_load(&g_connects) - atomic_load(&g_accepted));
				break;
			}
			usleep(500);
		}
		sa.sin_port = htons((uint16_t)atomic_load(&g_port));
		int s = (int)SYS(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
		if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			if (errno != ECONNREFUSED && errno != ECONNRESET && errno != ETIMEDOUT)
				FAIL("connect: %s", strerror(errno));
			atomic_fetch_add(&g_refused, 1);   /* listener being replaced */
			SYS(close(s));
			continue;
		}
		if (send(s, "c", 1, MSG_NOSIGNAL) < 0 && errno != EPIPE && errno != ECONNRESET)
			FAIL("client send: %s", strerror(errno));
		if (chance(4)) {
			struct linger lg = { .l_onoff = 1, .l_linger = 0 };   /* RST */
			SYS(setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)));
		}
		SYS(close(s));
		atomic_fetch_add(&g_connects, 1);
	}
	return NULL;
}

int run_listener(void)
{
	struct fdc_table *t;
	char extra[512];

	run_init();
	t = g_run.t;
	seed_thread(1000);
	atomic_store(&g_last_reset_ms, now_ms());
	listener_open(fdc_thread(t, 0));
	double el = run_threads(listener_worker, client);

	snprintf(extra, sizeof(extra),
	         "connects=%llu accepted=%llu refused=%llu listener_resets=%llu listener_deferred=%llu"
	         " epfail=%llu requeue_failed=%llu ctl_listener=%llu ctl_conn=%llu",
	         (unsigned long long)g_connects, (unsigned long long)g_accepted,
	         (unsigned long long)g_refused, (unsigned long long)g_resets,
	         (unsigned long long)g_ldeferred, (unsigned long long)atomic_load(&g_epfail_fails),
	         (unsigned long long)g_requeue_failed, (unsigned long long)g_ctl_listener,
	         (unsigned long long)g_ctl_conn);
	print_counters("listener", el, extra);
	CHECK(atomic_load(&g_accepted) > 0, "nothing accepted");

	/* no thread polls any more: each delete closes at once */
	for (int fd = 0; fd < g_run.maxfd; fd++) {
		uint32_t tgid = atomic_load(&t->fdtab[fd].refc_tgid) & FDC_TGID_MASK;
		if (!tgid)
			continue;
		struct fdc_thread *th = fdc_thread(t, (int)rndn((unsigned)t->nbthread));
		CHECK(tst_delete(th, fd, atomic_load(&g_rec[fd].cookie)) == 1, "idle delete deferred");
	}
	run_fini();
	return 0;
}
