/* fdcore stress program: entry point, options and the "churn" scenario.
 *
 * usage: stress_fd churn|takeover|listener|coown|shared [-t threads] [-g groups]
 *                  [-s seconds] [-n iterations] [-r seed] [-w widen]
 *                  [-d watchdog_seconds] [-p pause_seconds] [-c chaos] [-x bits]
 *                  [-b busy_threads] [-m nomem] [-e epfail]
 *   -t/-g   threads (4) and thread groups (1)
 *   -s/-n   wall-clock bound of the main phase (3 s) and per-thread
 *           iteration bound (none): whichever comes first
 *   -r      seed (printed in every FAIL and SUMMARY line)
 *   -w      the test hook yields in 1 of `widen` calls (64; 0 = never)
 *   -d      watchdog: abort if a busy worker is stuck that long (10 s)
 *   -p      every `pause` seconds all workers stop at a quiescent point and
 *           the table is checked against the kernel (0.5 s; 0 = only at end)
 *   -c      1 in `chaos` iterations a verb or enter/leave hits a random fd
 *           number the thread knows nothing about (8; 0 = never)
 *   -x      takeover and coown scenarios: which paths (see stress_takeover.c,
 *           stress_coown.c); shared: 1 lets the chaos verbs run (see
 *           stress_shared.c)
 *   -b      busy-loop threads (no context) beside the workers (0): with more
 *           runnable threads than cores, workers are preempted at any point
 *           of the protocols, not only where the hook yields
 *   -m      shared scenario: the core's realloc fails 1 in `m` calls (0 =
 *           never; common.h, nomem_point): its out-of-memory retries run
 *           beside everything else. The program is linked with
 *           -Wl,--wrap=realloc (tests/test_c_sanitizers.py, STRESS_CFLAGS)
 *   -e      listener and shared scenarios: the pollers' epoll_ctl ADD and
 *           MOD fail 1 in `e` calls in the main phase (0 = never; common.h):
 *           each failed registration must reach an owner as FDC_POLL_CTL
 *           (a connection's handler then deletes it; a listener's
 *           registration is made again by its thread), through the retry
 *           ring when -m leaves no memory for its report; linked with
 *           -Wl,--wrap=epoll_ctl
 * Environment (for long runs, overrides the options): FDC_STRESS_SECONDS,
 * FDC_STRESS_ITERS, FDC_STRESS_SEED; FDC_STRESS_GDB=1 makes the watchdog
 * print every thread's stack (gdb attaches) besides the shared lists.
 * Prints one "SUMMARY ..." line on success, exits 0; any failed check
 * prints "FAIL: ..." and aborts.
 *
 * churn: every thread loops creating socketpairs, inserting one end for
 * itself, for a random set of threads of its group or for another group,
 * flipping want/stop/may/cant at random, writing/reading through the peer
 * end, polling with real epoll and handling what it gets. Each incarnation
 * is deleted exactly once by the test, in one of three ways: by its creator
 * directly, by another thread through a hand-off queue (possibly of another
 * group), or by its creator from inside a handler that holds the running
 * bit. Numbers are reused at once (socketpair takes the lowest free ones).
 * Asserts (see common.c): exactly one close per incarnation, no close while
 * a running bit is held, every event belongs to the inserted incarnation
 * and reaches a thread holding running and in thread_mask, and at each
 * quiescent point polled == active for every owner, matching the kernel,
 * with no reference, running bit, update bit or orphan left behind.
 */
#define _GNU_SOURCE
#include "common.h"

#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAXLIVE 8
#define QCAP    64

struct conn {
	int fd, peer;
	uint64_t cookie;
	uint64_t mask;
	int tgid;
	int hdel;        /* delete from inside a handler: 1 + iterations left */
};

/* fds handed to a thread for deletion (the delete-from-another-thread case) */
struct handoff {
	pthread_mutex_t mu;
	int n;
	int fd[QCAP];
	uint64_t cookie[QCAP];
};
static struct handoff g_q[MAX_THREADS];

static void drain_queue(int tid, struct fdc_thread *th)
{
	int fd[QCAP], n;
	uint64_t ck[QCAP];

	CHECK(pthread_mutex_lock(&g_q[tid].mu) == 0, "lock");
	n = g_q[tid].n;
	memcpy(fd, g_q[tid].fd, sizeof(int) * (size_t)n);
	memcpy(ck, g_q[tid].cookie, sizeof(uint64_t) * (size_t)n);
	g_q[tid].n = 0;
	CHECK(pthread_mutex_unlock(&g_q[tid].mu) == 0, "unlock");
	for (int i = 0; i < n; i++)
		tst_delete(th, fd[i], ck[i]);
}

static int push_queue(int to, int fd, uint64_t cookie)
{
	int ok = 0;
	CHECK(pthread_mutex_lock(&g_q[to].mu) == 0, "lock");
	if (g_q[to].n < QCAP) {
		g_q[to].fd[g_q[to].n] = fd;
		g_q[to].cookie[g_q[to].n] = cookie;
		g_q[to].n++;
		ok = 1;
	}
	CHECK(pthread_mutex_unlock(&g_q[to].mu) == 0, "unlock");
	return ok;
}

static void verb(int fd, int (*fn)(struct fdc_thread *, int), struct fdc_thread *th, const char *name)
{
	int rc = fn(th, fd);
	CHECKFD(fd, rc >= 0, "%s(fd %d): %s", name, fd, strerror(-rc));
}

static void conn_forget(struct conn *live, int *n, int i)
{
	if (live[i].peer >= 0)
		SYS(close(live[i].peer));
	live[i] = live[--*n];
}

static void create_conn(struct fdc_thread *th, struct conn *c)
{
	struct fdc_table *t = g_run.t;
	int sv[2], pick = (int)rndn(2);

	SYS(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv));
	c->fd = sv[pick];
	c->peer = sv[!pick];
	c->tgid = th->tgid;
	if (t->nbgroup > 1 && chance(5))
		c->tgid = 1 + (int)rndn((unsigned)t->nbgroup);   /* inserted for another group */
	uint64_t en = t->groups[c->tgid].enabled_mask;
	c->mask = (c->tgid == th->tgid && chance(2)) ? th->ltid_bit : (rnd() & en);
	if (!c->mask)
		c->mask = en;
	c->hdel = 0;
	c->cookie = tst_insert(c->fd, KIND_CONN, c->tgid, c->mask, 0);
	if (chance(2))
		verb(c->fd, fdc_want_recv, th, "want_recv");
	if (chance(4))
		verb(c->fd, fdc_want_send, th, "want_send");
}

/* fdc_enter/fdc_leave outside a poll (a task using its connection): only
 * the creator deletes and takeovers do not happen here, so the outcome is
 * known: DONE for an owner, MIGRATED for a non-owner of the group, CLOSED
 * for another group's thread.
 */
static void enter_directly(struct fdc_thread *th, struct conn *c)
{
	uint32_t gen = 0;
	int want = c->tgid != th->tgid ? FDC_CLOSED :
	           (c->mask & th->ltid_bit) ? FDC_DONE : FDC_MIGRATED;
	int rc = fdc_enter(th, c->fd, &gen);

	CHECKFD(c->fd, rc == want, "fdc_enter(fd %d) = %d, expected %d", c->fd, rc, want);
	if (rc != FDC_DONE)
		return;
	struct fdc_event ev = { .fd = c->fd, .gen = gen, .kind = KIND_CONN, .owner = c->cookie };
	check_event(th, &ev);
	if (chance(4))
		sched_yield();   /* pollers of co-owners enter meanwhile */
	tst_leave(th, &ev);
}

/* one random operation by the creator, who alone may name the fd outside
 * a handler until it deletes or hands it off.
 */
static void conn_op(int tid, struct fdc_thread *th, struct conn *live, int *n, int i)
{
	struct conn *c = &live[i];
	char b[64];

	switch (rndn(13)) {
	case 0: verb(c->fd, fdc_want_recv, th, "want_recv"); break;
	case 1:
		switch (rndn(6)) {
		case 0:   /* a paused connection that still hears hang-ups */
			verb(c->fd, chance(2) ? fdc_want_hup : fdc_stop_hup, th, "want/stop_hup");
			break;
		case 1:   /* a stream connection pausing (worker/stream.py _sync): recv
			   * off and the watch on, no update pass between */
			verb(c->fd, fdc_stop_recv, th, "stop_recv");
			verb(c->fd, fdc_want_hup, th, "want_hup");
			break;
		case 2:   /* and resuming: recv on, the watch off, no pass between (a
			   * pass that inferred the registration's kind from the state
			   * kept a watch without EPOLLIN: seed 3302437362) */
			verb(c->fd, fdc_want_recv, th, "want_recv");
			verb(c->fd, fdc_stop_hup, th, "stop_hup");
			break;
		default:
			verb(c->fd, fdc_stop_recv, th, "stop_recv");
		}
		break;
	case 2: verb(c->fd, fdc_want_send, th, "want_send"); break;
	case 3: verb(c->fd, fdc_stop_send, th, "stop_send"); break;
	case 4: verb(c->fd, chance(2) ? fdc_may_recv : fdc_cant_recv, th, "may/cant_recv"); break;
	case 5: verb(c->fd, chance(2) ? fdc_may_send : fdc_cant_send, th, "may/cant_send"); break;
	case 6: case 7:
		/* EPIPE: we shut the peer's write side (case 9) */
		if (c->peer >= 0 && send(c->peer, "x", 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
		    errno != EPIPE)
			FAIL("send to peer: %s", strerror(errno));
		break;
	case 8:
		if (c->peer >= 0)
			while (recv(c->peer, b, sizeof(b), 0) > 0)
				;
		break;
	case 9:
		if (c->peer >= 0 && chance(4))
			SYS(shutdown(c->peer, SHUT_WR));   /* RDHUP on our end */
		break;
	case 10:
		enter_directly(th, c);
		break;
	default:
		if (c->hdel)
			break;
		if (chance(2) && c->peer >= 0) {   /* peer first: HUP while still polled */
			SYS(close(c->peer));
			c->peer = -1;
		}
		switch (rndn(3)) {
		case 0:
			tst_delete(th, c->fd, c->cookie);
			conn_forget(live, n, i);
			break;
		case 1: {
			int to = (tid + 1 + (int)rndn((unsigned)g_opt.nthreads - 1)) % g_opt.nthreads;
			if (g_opt.nthreads > 1 && push_queue(to, c->fd, c->cookie)) {
				if (chance(2))
					CHECK(fdc_wake(g_run.t, to) >= 0, "fdc_wake");
			} else
				tst_delete(th, c->fd, c->cookie);
			conn_forget(live, n, i);
			break;
		}
		default:
			if (c->tgid == th->tgid && (c->mask & th->ltid_bit)) {
				/* make it readable and delete it from our handler */
				c->hdel = 1 + 64;
				verb(c->fd, fdc_want_recv, th, "want_recv");
				if (c->peer >= 0 && send(c->peer, "z", 1, MSG_NOSIGNAL) < 0 &&
				    errno != EAGAIN && errno != EPIPE)
					FAIL("send to peer: %s", strerror(errno));
			} else {
				tst_delete(th, c->fd, c->cookie);
				conn_forget(live, n, i);
			}
		}
	}
}

/* A handler, holding the running bit: move a byte each way, and delete the
 * fd if its creator (us) asked for it.
 */
static void handle(struct fdc_thread *th, struct fdc_event *ev, struct conn *live, int *n,
                   int leave)
{
	int fd = ev->fd;
	char b[64];

	check_event(th, ev);
	if (ev->events & (FDC_POLL_IN | FDC_POLL_HUP | FDC_POLL_ERR | FDC_POLL_RDHUP)) {
		ssize_t k = recv(fd, b, sizeof(b), 0);
		if (k < 0 && errno == EAGAIN)
			verb(fd, fdc_cant_recv, th, "cant_recv");
		else if (k == 0) {
			verb(fd, fdc_stop_recv, th, "stop_recv");   /* EOF: stop spinning on it */
			verb(fd, fdc_stop_hup, th, "stop_hup");     /* RDHUP is level-triggered */
		}
		else if (k < 0 && errno != ECONNRESET)
			FAILFD(fd, "recv: %s", strerror(errno));
	}
	if (ev->events & FDC_POLL_OUT) {
		if (send(fd, "y", 1, MSG_NOSIGNAL) < 0) {
			if (errno == EAGAIN)
				verb(fd, fdc_cant_send, th, "cant_send");
			else if (errno != EPIPE && errno != ECONNRESET)
				FAILFD(fd, "send: %s", strerror(errno));
		}
		if (chance(2))
			verb(fd, fdc_stop_send, th, "stop_send");
	}
	if (chance(16))
		sched_yield();   /* hold the running bit a little longer */
	for (int i = 0; i < *n; i++) {
		if (live[i].fd == fd && live[i].cookie == ev->owner && live[i].hdel) {
			tst_delete(th, fd, live[i].cookie);
			atomic_fetch_add(&g_run.handler_deletes, 1);
			conn_forget(live, n, i);
			break;
		}
	}
	if (leave)
		tst_leave(th, ev);
}

/* Half of the batches are left with fdc_leave_batch after all handlers
 * ran, some events of them having been left individually already (which
 * the batch must skip harmlessly).
 */
static void poll_once(struct fdc_thread *th, int timeout, struct conn *live, int *n)
{
	struct fdc_event evs[64];
	int k = fdc_poll(th, timeout, evs, 64);
	int batch = chance(2);

	CHECK(k >= 0, "fdc_poll: %s", strerror(-k));
	for (int i = 0; i < k; i++)
		handle(th, &evs[i], live, n, !batch || chance(4));
	if (!batch)
		return;
	uint64_t before = tl_closes;
	int closed = fdc_leave_batch(th, evs, k);
	CHECK(closed >= 0 && closed <= k, "fdc_leave_batch(%d events) = %d", k, closed);
	CHECK(tl_closes - before <= (uint64_t)closed, "fdc_leave_batch closed %llu, said %d",
	      (unsigned long long)(tl_closes - before), closed);
}

static void *churn_worker(void *arg)
{
	int tid = (int)(intptr_t)arg;
	struct fdc_thread *th = fdc_thread(g_run.t, tid);
	struct conn live[MAXLIVE];
	int n = 0;

	seed_thread(tid);
	while (worker_continue(th, 0)) {
		drain_queue(tid, th);
		if (n < MAXLIVE && chance(2))
			create_conn(th, &live[n++]);
		for (int ops = (int)rndn(3); ops > 0 && n > 0; ops--)
			conn_op(tid, th, live, &n, (int)rndn((unsigned)n));
		for (int i = 0; i < n; i++)   /* handler deletes that never got an event */
			if (live[i].hdel && --live[i].hdel == 0) {
				tst_delete(th, live[i].fd, live[i].cookie);
				conn_forget(live, &n, i--);
			}
		poll_once(th, chance(64) ? 1 : 0, live, &n);
	}

	quiescent_point(th, 0);
	/* nobody holds a running bit now: every delete must close at once */
	while (n > 0) {
		CHECK(tst_delete(th, live[0].fd, live[0].cookie) == 1, "idle delete deferred");
		conn_forget(live, &n, 0);
	}
	bar_wait(tid);
	drain_queue(tid, th);
	bar_wait(tid);
	for (int i = 0; i < 3; i++)
		poll_once(th, 0, live, &n);   /* only stale reports may remain */
	bar_wait(tid);
	return NULL;
}

static int iterations_done(void)
{
	for (int i = 0; i < g_opt.nthreads; i++)
		if (atomic_load(&g_run.iters_done[i]) < g_opt.iters)
			return 0;
	return 1;
}

/* Starts the workers (plus `extra`, a thread without a context), asks for a
 * quiescent point every g_opt.pause seconds, and stops them once every
 * worker did its iterations or at the deadline; joins everything.
 */
static _Atomic int g_busy_stop;

static void *busy_loop(void *arg)
{
	volatile uint64_t x = (uint64_t)(intptr_t)arg;

	while (!atomic_load_explicit(&g_busy_stop, memory_order_relaxed))
		for (int i = 0; i < 4096; i++)
			x = x * 6364136223846793005ULL + 1;
	return NULL;
}

double run_threads(void *(*fn)(void *), void *(*extra)(void *))
{
	pthread_t th[MAX_THREADS], ex, busy[MAX_THREADS];
	double t0 = now_s(), next = t0 + g_opt.pause;

	atomic_store(&g_busy_stop, 0);
	for (int i = 0; i < g_opt.busy; i++)
		CHECK(pthread_create(&busy[i], NULL, busy_loop, (void *)(intptr_t)i) == 0, "pthread_create");
	watchdog_start();
	for (int i = 0; i < g_opt.nthreads; i++)
		CHECK(pthread_create(&th[i], NULL, fn, (void *)(intptr_t)i) == 0, "pthread_create");
	if (extra)
		CHECK(pthread_create(&ex, NULL, extra, NULL) == 0, "pthread_create");
	while (!iterations_done() && now_s() - t0 < g_opt.seconds) {
		usleep(10 * 1000);
		if (g_opt.pause > 0 && now_s() >= next) {
			int req = atomic_fetch_add(&g_run.pause_req, 1) + 1;
			/* the watchdog covers a worker that never arrives */
			while (atomic_load(&g_run.pause_ack) < req * g_opt.nthreads)
				usleep(1000);
			next = now_s() + g_opt.pause;
		}
	}
	atomic_store(&g_run.stop, 1);
	for (int i = 0; i < g_opt.nthreads; i++)
		CHECK(pthread_join(th[i], NULL) == 0, "pthread_join");
	if (extra)
		CHECK(pthread_join(ex, NULL) == 0, "pthread_join");
	watchdog_stop();
	atomic_store(&g_busy_stop, 1);
	for (int i = 0; i < g_opt.busy; i++)
		CHECK(pthread_join(busy[i], NULL) == 0, "pthread_join");
	return now_s() - t0;
}

int run_churn(void)
{
	run_init();
	for (int i = 0; i < MAX_THREADS; i++)
		CHECK(pthread_mutex_init(&g_q[i].mu, NULL) == 0, "mutex");
	double el = run_threads(churn_worker, NULL);
	char extra[128];
	snprintf(extra, sizeof(extra), "handler_deletes=%llu",
	         (unsigned long long)atomic_load(&g_run.handler_deletes));
	print_counters("churn", el, extra);
	run_fini();
	for (int i = 0; i < MAX_THREADS; i++)
		pthread_mutex_destroy(&g_q[i].mu);
	return 0;
}

static void usage(void)
{
	fprintf(stderr, "usage: stress_fd churn|takeover|listener|coown|shared [-t threads] [-g groups] "
	                "[-s seconds] [-n iterations] [-r seed] [-w widen] [-d watchdog] [-p pause] [-c chaos] [-x bits]"
	                " [-b busy] [-m nomem] [-e epfail]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *env;
	int c;

	if (argc < 2)
		usage();
	g_opt = (struct opts){ .mode = argv[1], .nthreads = 4, .ngroups = 1, .seconds = 3,
	                       .iters = 1L << 40, .seed = (uint64_t)time(NULL), .widen = 64,
	                       .watchdog = 10, .pause = 0.5, .chaos = 8 };
	optind = 2;
	while ((c = getopt(argc, argv, "t:g:s:n:r:w:d:x:p:c:b:m:e:")) != -1) {
		switch (c) {
		case 't': g_opt.nthreads = atoi(optarg); break;
		case 'g': g_opt.ngroups = atoi(optarg); break;
		case 's': g_opt.seconds = atof(optarg); break;
		case 'n': g_opt.iters = atol(optarg); break;
		case 'r': g_opt.seed = strtoull(optarg, NULL, 0); break;
		case 'w': g_opt.widen = atoi(optarg); break;
		case 'd': g_opt.watchdog = atof(optarg); break;
		case 'c': g_opt.chaos = atoi(optarg); break;
		case 'p': g_opt.pause = atof(optarg); break;
		case 'x': g_opt.extended = atoi(optarg); break;
		case 'b': g_opt.busy = atoi(optarg); break;
		case 'm': g_opt.nomem = atoi(optarg); break;
		case 'e': g_opt.epfail = atoi(optarg); break;
		default: usage();
		}
	}
	if ((env = getenv("FDC_STRESS_SECONDS")) && *env)
		g_opt.seconds = atof(env);
	if ((env = getenv("FDC_STRESS_ITERS")) && *env)
		g_opt.iters = atol(env);
	if ((env = getenv("FDC_STRESS_SEED")) && *env)
		g_opt.seed = strtoull(env, NULL, 0);
	if (g_opt.nthreads < 1 || g_opt.nthreads > MAX_THREADS || g_opt.ngroups < 1 ||
	    g_opt.ngroups > g_opt.nthreads || g_opt.busy < 0 || g_opt.busy > MAX_THREADS || g_opt.nomem < 0 ||
	    g_opt.epfail < 0)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(g_opt.mode, "churn"))
		return run_churn();
	if (!strcmp(g_opt.mode, "takeover"))
		return run_takeover();
	if (!strcmp(g_opt.mode, "listener"))
		return run_listener();
	if (!strcmp(g_opt.mode, "coown"))
		return run_coown();
	if (!strcmp(g_opt.mode, "shared"))
		return run_shared();
	usage();
}
