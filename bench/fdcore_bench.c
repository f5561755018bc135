/* sockherd bench: native fd core (fdcore) micro-benchmarks and stress run.
 *
 * Built and driven by bench/fdcore_bench.py:
 *   gcc -O2 -pthread -I fdcore fdcore/*.c \
 *       bench/fdcore_bench.c -o fdcore_bench
 *
 * Usage: fdcore_bench MODE [options]
 *   --secs S         duration of a timed mode (default 1)
 *   --threads N      worker / poller threads (stress: thread contexts)
 *   --groups G       stress: thread groups
 *   --pool P         takeover: fds in the pool; atomic: RMW per op;
 *                    stress: live fds
 *   --fds N          events: ready socketpairs
 *   --clients C      listener: client threads;  --pace-us U: pause after
 *                    each connect;  --excl 0|1: FDC_EXCLUSIVE registration
 *   --variant V      per mode: core | raw (peer) | disown | private | steal
 *                    | shared
 *   --no-pin         do not pin thread i to CPU i % ncpu; --same-cpu: pin
 *                    every thread to CPU 0
 *   --stress-ops N, --stress-secs S, --hang-secs S, --blind-verbs 0|1,
 *   --shared 0|1     stress limits and profile (see bench/README.md)
 * Every mode prints one JSON object per measured row on stdout; the driver
 * turns them into the table. Modes: insdel, takeover, atomic, enterleave,
 * wake, events, busy, listener, stress, repro-takeover, repro-insert.
 *
 * Uses the public API (fd.h); the stress mode also reads the entry fields
 * of fd-t.h directly to check invariants (read-only).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fd.h"

/* ------------------------------------------------------------------------ */
/* options and helpers                                                      */

static double opt_secs = 1.0;
static int opt_threads = 1;
static int opt_groups = 1;
static int opt_pool = 4;
static int opt_fds = 1;
static int opt_clients = 2;
static int opt_excl = 0;
static int opt_pin = 1;
static int opt_same_cpu = 0;  /* pin every thread to CPU 0 */
static int opt_pace_us = 0;   /* listener: client pause after each connect */
static const char *opt_variant = "core";
static uint64_t opt_stress_ops = 100000000ULL;
static double opt_stress_secs = 3000.0;
static int opt_blind = 1;     /* stress: verbs on random numbers, not only held fds */
static int opt_shared = 1;    /* stress: multi-thread masks (shared update lists) */
static double opt_hang_secs = 15.0;

static _Atomic int stop_flag;
static pthread_barrier_t start_bar;

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "fdcore_bench: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(2);
}

static int stopped(void)
{
	return atomic_load_explicit(&stop_flag, memory_order_relaxed);
}

static void pin(int i)
{
	cpu_set_t set;
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (!opt_pin || n <= 0)
		return;
	CPU_ZERO(&set);
	CPU_SET(opt_same_cpu ? 0 : i % n, &set);
	pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static struct fdc_table *table(int maxfd, int nth, int ngr)
{
	int err;
	struct fdc_table *t = fdc_table_new(maxfd, nth, ngr, &err);

	if (!t)
		die("fdc_table_new: %s", strerror(-err));
	return t;
}

static int sock_one(void)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair: %s", strerror(errno));
	close(sv[1]);
	return sv[0];
}

/* per-thread worker record; padded so counters do not share lines */
struct worker {
	int idx;
	struct fdc_table *t;
	struct fdc_thread *th;
	void *arg;
	uint64_t ops, ok, busy, stale, other, bytes;
	double el;
	pthread_t pt;
} __attribute__((aligned(128)));

/* Runs fn in n threads, releases them together, stops them after `secs`
 * (the stop hook, if any, is called to unblock sleepers), joins.
 */
static void run_workers(struct worker *w, int n, void *(*fn)(void *), double secs,
                        void (*on_stop)(struct worker *, int))
{
	atomic_store(&stop_flag, 0);
	pthread_barrier_init(&start_bar, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++) {
		w[i].idx = i;
		if (pthread_create(&w[i].pt, NULL, fn, &w[i]))
			die("pthread_create");
	}
	pthread_barrier_wait(&start_bar);
	usleep((useconds_t)(secs * 1e6));
	atomic_store(&stop_flag, 1);
	if (on_stop)
		on_stop(w, n);
	for (int i = 0; i < n; i++)
		pthread_join(w[i].pt, NULL);
	pthread_barrier_destroy(&start_bar);
}

#define BEGIN(w) do { pin((w)->idx); pthread_barrier_wait(&start_bar); } while (0)

static uint64_t sum_ops(struct worker *w, int n) { uint64_t s = 0; for (int i = 0; i < n; i++) s += w[i].ops; return s; }
static double max_el(struct worker *w, int n) { double m = 0; for (int i = 0; i < n; i++) if (w[i].el > m) m = w[i].el; return m; }

static double cpu_secs(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + ru.ru_stime.tv_sec +
	       ru.ru_stime.tv_usec * 1e-6;
}

static double cpu0;   /* CPU time at the start of the mode */

/* one JSON row: name, threads, ops, seconds, then extra "k":v pairs; cpu is
 * the process CPU time used by the mode / wall time (2.0 = both cores busy;
 * less means the threads did not get the CPUs: other load on the machine) */
static void row(const char *mode, const char *name, int threads, uint64_t ops, double secs,
                const char *extra_fmt, ...)
{
	char extra[1024] = "";
	va_list ap;

	if (extra_fmt) {
		va_start(ap, extra_fmt);
		vsnprintf(extra, sizeof(extra), extra_fmt, ap);
		va_end(ap);
	}
	printf("{\"mode\":\"%s\",\"name\":\"%s\",\"threads\":%d,\"ops\":%llu,\"secs\":%.4f,"
	       "\"rate\":%.1f,\"cpu\":%.3f%s%s}\n", mode, name, threads, (unsigned long long)ops, secs,
	       secs > 0 ? ops / secs : 0.0, secs > 0 ? (cpu_secs() - cpu0) / secs : 0.0,
	       extra[0] ? "," : "", extra);
	fflush(stdout);
}

/* ------------------------------------------------------------------------ */
/* 1. insert + delete pairs                                                  */

static int insdel_src;

static void *insdel_fn(void *p)
{
	struct worker *w = p;
	int raw = !strcmp(opt_variant, "raw");
	int tableonly = !strcmp(opt_variant, "disown");
	/* accepted: what the worker's accept path does, no probe syscall */
	uint32_t accepted = !strcmp(opt_variant, "accepted") || tableonly ? FDC_ACCEPTED : 0;
	uint64_t owner = ((uint64_t)w->idx << 40) | 1;
	int fixed = tableonly ? dup(insdel_src) : -1;
	double t0;

	BEGIN(w);
	t0 = now();
	while (!stopped()) {
		for (int k = 0; k < 256; k++) {
			int fd = tableonly ? fixed : dup(insdel_src), rc;

			if (fd < 0)
				die("dup: %s", strerror(errno));
			if (raw) {
				close(fd);
				w->ops++;
				continue;
			}
			rc = fdc_insert(w->t, fd, owner++, 0, 1, 1ULL << w->idx,
			                (tableonly ? FDC_DISOWN : 0) | accepted);
			if (rc < 0) {
				w->other++;
				if (!tableonly)
					close(fd);
				continue;
			}
			rc = fdc_delete(w->th, fd);
			if (rc != 1)
				w->busy++;   /* delete deferred or failed: unexpected here */
			w->ops++;
		}
	}
	w->el = now() - t0;
	if (fixed >= 0)
		close(fixed);
	return NULL;
}

static void mode_insdel(void)
{
	int n = opt_threads;
	struct fdc_table *t = table(1 << 16, n, 1);
	struct worker w[64];
	uint64_t ops, errs = 0, defer = 0;

	memset(w, 0, sizeof(w));
	insdel_src = sock_one();
	for (int i = 0; i < n; i++) {
		w[i].t = t;
		w[i].th = fdc_thread(t, i);
	}
	run_workers(w, n, insdel_fn, opt_secs, NULL);
	ops = sum_ops(w, n);
	for (int i = 0; i < n; i++) {
		errs += w[i].other;
		defer += w[i].busy;
	}
	row("insdel", opt_variant, n, ops, max_el(w, n), "\"insert_errors\":%llu,\"deferred\":%llu",
	    (unsigned long long)errs, (unsigned long long)defer);
	close(insdel_src);
	fdc_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* 2. contended takeover                                                     */

static int *tk_fds;
static uint64_t *tk_owner;

static void *takeover_fn(void *p)
{
	struct worker *w = p;
	int priv = !strcmp(opt_variant, "private");
	int steal = !strcmp(opt_variant, "steal");
	uint64_t bit = 1ULL << w->idx;
	int P = opt_pool;
	int base = priv ? w->idx * P : 0;
	unsigned i = priv ? 0 : (unsigned)w->idx;
	double t0;

	BEGIN(w);
	t0 = now();
	while (!stopped()) {
		for (int k = 0; k < 1024; k++) {
			int j = base + (int)(i++ % (unsigned)P);
			int rc;

			/* steal: only take fds another thread owns, so that every
			 * success is a real hand-off between threads */
			if (steal && atomic_load_explicit(&w->t->fdtab[tk_fds[j]].thread_mask,
			                                  memory_order_relaxed) == bit) {
				w->bytes++;
				continue;
			}
			rc = fdc_takeover(w->th, tk_fds[j], tk_owner[j]);

			if (rc == 0)
				w->ok++;
			else if (rc == -EBUSY)
				w->busy++;
			else if (rc == -ESTALE)
				w->stale++;
			else
				w->other++;
		}
	}
	w->el = now() - t0;
	w->ops = w->ok + w->busy + w->stale + w->other;
	return NULL;
}

static void mode_takeover(void)
{
	int n = opt_threads, P = opt_pool;
	int priv = !strcmp(opt_variant, "private");
	int nfd = priv ? P * n : P;
	struct fdc_table *t = table(1 << 16, n, 1);
	struct worker w[64];
	uint64_t ok = 0, busy = 0, stale = 0, other = 0, bad = 0, skipped = 0;
	int src = sock_one();
	double el;

	memset(w, 0, sizeof(w));
	tk_fds = calloc((size_t)nfd, sizeof(int));
	tk_owner = calloc((size_t)nfd, sizeof(uint64_t));
	for (int j = 0; j < nfd; j++) {
		tk_fds[j] = dup(src);
		tk_owner[j] = 0x5000 + (uint64_t)j;
		/* starts owned by thread 0 (private: by its user), idle (no ACTIVE) */
		if (fdc_insert(t, tk_fds[j], tk_owner[j], 0, 1, priv ? 1ULL << (j / P) : 1, 0))
			die("insert");
	}
	for (int i = 0; i < n; i++) {
		w[i].t = t;
		w[i].th = fdc_thread(t, i);
	}
	run_workers(w, n, takeover_fn, opt_secs, NULL);
	for (int i = 0; i < n; i++) {
		ok += w[i].ok;
		busy += w[i].busy;
		stale += w[i].stale;
		other += w[i].other;
		skipped += w[i].bytes;
	}
	/* after the run: each fd has exactly one owner bit and nobody inside */
	for (int j = 0; j < nfd; j++) {
		struct fdc_fdinfo fi;

		fdc_dump(t, tk_fds[j], &fi);
		if (fi.running_mask || __builtin_popcountll(fi.thread_mask) != 1 || fi.refcount)
			bad++;
		fdc_delete(fdc_thread(t, 0), tk_fds[j]);
	}
	el = max_el(w, n);
	row("takeover", opt_variant, n, ok, el,
	    "\"pool\":%d,\"attempts\":%llu,\"attempt_rate\":%.1f,\"busy\":%llu,\"stale\":%llu,"
	    "\"other\":%llu,\"fail_ratio\":%.4f,\"bad_entries\":%llu,\"skipped_own\":%llu",
	    P, (unsigned long long)(ok + busy + stale + other), (ok + busy + stale + other) / el,
	    (unsigned long long)busy, (unsigned long long)stale, (unsigned long long)other,
	    (ok + busy + stale + other) ? (double)(busy + stale + other) / (ok + busy + stale + other) : 0.0,
	    (unsigned long long)bad, (unsigned long long)skipped);
	free(tk_fds);
	free(tk_owner);
	close(src);
	fdc_table_free(t);
}

/* Peer for takeover: the hardware ceiling of k atomic RMWs per op on one
 * shared cache line (a successful takeover does 7 on the entry's line:
 * grab, CAS running, CAS thread_mask, nb_takeover++, state &=, running &=,
 * drop), T threads hammering it. --pool = k.
 */
static struct { _Atomic uint64_t v[8]; } __attribute__((aligned(64))) shared_line;
static struct { _Atomic uint64_t v[8]; } __attribute__((aligned(64))) priv_line[64];

static void *atomic_fn(void *p)
{
	struct worker *w = p;
	int k = opt_pool;
	int priv = !strcmp(opt_variant, "private");
	_Atomic uint64_t *v = priv ? priv_line[w->idx].v : shared_line.v;
	double t0;

	BEGIN(w);
	t0 = now();
	while (!stopped()) {
		for (int r = 0; r < 1024; r++) {
			for (int j = 0; j < k; j++)
				atomic_fetch_add(&v[j & 7], 1);
			w->ops++;
		}
	}
	w->el = now() - t0;
	return NULL;
}

static void mode_atomic(void)
{
	int n = opt_threads;
	struct worker w[64];

	memset(w, 0, sizeof(w));
	run_workers(w, n, atomic_fn, opt_secs, NULL);
	row("atomic", opt_variant, n, sum_ops(w, n), max_el(w, n), "\"rmw_per_op\":%d", opt_pool);
}

/* ------------------------------------------------------------------------ */
/* 3. enter / leave pairs                                                    */

static int *el_fds;

static void *enterleave_fn(void *p)
{
	struct worker *w = p;
	int fd = el_fds[!strcmp(opt_variant, "private") ? w->idx : 0];
	double t0;
	uint32_t gen;

	BEGIN(w);
	t0 = now();
	while (!stopped()) {
		for (int k = 0; k < 1024; k++) {
			if (fdc_enter(w->th, fd, &gen) != FDC_DONE) {
				w->other++;
				continue;
			}
			if (fdc_leave(w->th, fd, gen) != FDC_DONE)
				w->other++;
			w->ops++;
		}
	}
	w->el = now() - t0;
	return NULL;
}

static void mode_enterleave(void)
{
	int n = opt_threads;
	int priv = !strcmp(opt_variant, "private");
	struct fdc_table *t = table(1 << 16, n, 1);
	struct worker w[64];
	int src = sock_one(), nfd = priv ? n : 1;
	uint64_t errs = 0;

	memset(w, 0, sizeof(w));
	el_fds = calloc((size_t)nfd, sizeof(int));
	for (int j = 0; j < nfd; j++) {
		el_fds[j] = dup(src);
		if (fdc_insert(t, el_fds[j], 0x77, 0, 1, priv ? 1ULL << j : (1ULL << n) - 1, 0))
			die("insert");
	}
	for (int i = 0; i < n; i++) {
		w[i].t = t;
		w[i].th = fdc_thread(t, i);
	}
	run_workers(w, n, enterleave_fn, opt_secs, NULL);
	for (int i = 0; i < n; i++)
		errs += w[i].other;
	row("enterleave", opt_variant, n, sum_ops(w, n), max_el(w, n), "\"errors\":%llu",
	    (unsigned long long)errs);
	for (int j = 0; j < nfd; j++)
		fdc_delete(fdc_thread(t, 0), el_fds[j]);
	free(el_fds);
	close(src);
	fdc_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* 4a. poll wake-up round trips: thread A in fdc_poll woken by B's fdc_wake,
 * then A wakes B. Peer "raw": the same with bare epoll_wait + eventfd.
 */

static int raw_ep[2], raw_ev[2];

static void *wake_fn(void *p)
{
	struct worker *w = p;
	int me = w->idx, other = 1 - w->idx;
	int raw = !strcmp(opt_variant, "raw");
	struct fdc_event ev[8];
	struct epoll_event eev[8];
	uint64_t one = 1, v;
	double t0;

	BEGIN(w);
	t0 = now();
	if (me == 0) {
		if (raw)
			(void)!write(raw_ev[other], &one, 8);
		else
			fdc_wake(w->t, other);
	}
	while (!stopped()) {
		if (raw) {
			int n = epoll_wait(raw_ep[me], eev, 8, -1);

			if (n > 0)
				(void)!read(raw_ev[me], &v, 8);
			(void)!write(raw_ev[other], &one, 8);
		}
		else {
			fdc_poll(w->th, -1, ev, 8);
			fdc_wake(w->t, other);
		}
		w->ops++;
	}
	w->el = now() - t0;
	/* let the other side out */
	if (raw)
		(void)!write(raw_ev[other], &one, 8);
	else
		fdc_wake(w->t, other);
	return NULL;
}

static void mode_wake(void)
{
	struct fdc_table *t = table(1 << 16, 2, 1);
	struct worker w[2];
	struct fdc_counters c0;

	memset(w, 0, sizeof(w));
	for (int i = 0; i < 2; i++) {
		struct epoll_event e = { .events = EPOLLIN };

		w[i].t = t;
		w[i].th = fdc_thread(t, i);
		raw_ep[i] = epoll_create1(EPOLL_CLOEXEC);
		raw_ev[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		e.data.fd = raw_ev[i];
		epoll_ctl(raw_ep[i], EPOLL_CTL_ADD, raw_ev[i], &e);
	}
	run_workers(w, 2, wake_fn, opt_secs, NULL);
	fdc_counters(w[0].th, &c0);
	/* each side counts one turn per wake it got: a round trip is one turn
	 * of each */
	row("wake", opt_variant, 2, w[0].ops < w[1].ops ? w[0].ops : w[1].ops, max_el(w, 2),
	    "\"wakeups_t0\":%llu,\"same_cpu\":%d", (unsigned long long)c0.wakeups, opt_same_cpu);
	for (int i = 0; i < 2; i++) {
		close(raw_ep[i]);
		close(raw_ev[i]);
	}
	fdc_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* 4b. events/s: --fds socketpairs whose peer end holds one unread byte, so
 * level-triggered epoll reports each at every poll. "core": fdc_poll +
 * fdc_leave of each; "raw": bare epoll_wait. "busy": a writer thread streams
 * 4 KiB writes into one socketpair and the poller thread reads until EAGAIN
 * (fdc_cant_recv) at each report: events/s and MB/s.
 */
static void mode_events(void)
{
	int n = opt_fds;
	struct fdc_table *t = table(1 << 16, 1, 1);
	struct fdc_thread *th = fdc_thread(t, 0);
	int raw = !strcmp(opt_variant, "raw");
	int ep = epoll_create1(EPOLL_CLOEXEC);
	int (*sv)[2] = calloc((size_t)n, sizeof(*sv));
	struct fdc_event ev[FDC_EVBATCH];
	struct epoll_event eev[FDC_EVBATCH];
	uint64_t events = 0, polls = 0, errs = 0;
	double t0, el;

	for (int i = 0; i < n; i++) {
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv[i]) < 0)
			die("socketpair");
		(void)!write(sv[i][1], "x", 1);
		if (raw) {
			struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP, .data.fd = sv[i][0] };

			epoll_ctl(ep, EPOLL_CTL_ADD, sv[i][0], &e);
		}
		else {
			if (fdc_insert(t, sv[i][0], 0x99, 0, 1, 1, 0))
				die("insert");
			fdc_want_recv(th, sv[i][0]);
		}
	}
	t0 = now();
	while (now() - t0 < opt_secs) {
		for (int k = 0; k < 64; k++) {
			int m;

			if (raw) {
				m = epoll_wait(ep, eev, FDC_EVBATCH, 0);
			}
			else {
				m = fdc_poll(th, 0, ev, FDC_EVBATCH);
				for (int i = 0; i < m; i++)
					if (fdc_leave(th, ev[i].fd, ev[i].gen) != FDC_DONE)
						errs++;
			}
			if (m < 0)
				errs++;
			else
				events += (uint64_t)m;
			polls++;
		}
	}
	el = now() - t0;
	row("events", opt_variant, 1, events, el,
	    "\"fds\":%d,\"polls\":%llu,\"per_poll\":%.2f,\"errors\":%llu", n,
	    (unsigned long long)polls, (double)events / (double)polls, (unsigned long long)errs);
	for (int i = 0; i < n; i++) {
		if (raw)
			close(sv[i][0]);
		else
			fdc_delete(th, sv[i][0]);
		close(sv[i][1]);
	}
	free(sv);
	close(ep);
	fdc_table_free(t);
}

static int busy_wfd;

static void *busy_writer(void *p)
{
	struct worker *w = p;
	static char buf[4096];

	pin(1);
	while (!stopped()) {
		ssize_t r = write(busy_wfd, buf, sizeof(buf));

		if (r > 0)
			w->bytes += (uint64_t)r;
		else if (r < 0 && errno != EINTR && errno != EAGAIN)
			break;
	}
	return NULL;
}

static void mode_busy(void)
{
	int raw = !strcmp(opt_variant, "raw");
	struct fdc_table *t = table(1 << 16, 1, 1);
	struct fdc_thread *th = fdc_thread(t, 0);
	int sv[2], ep = epoll_create1(EPOLL_CLOEXEC);
	struct fdc_event ev[8];
	struct epoll_event eev[8];
	struct worker wr;
	static char buf[65536];
	uint64_t events = 0, bytes = 0;
	double t0, el;
	pthread_t pt;

	memset(&wr, 0, sizeof(wr));
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair");
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	busy_wfd = sv[1];
	if (raw) {
		struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP, .data.fd = sv[0] };

		epoll_ctl(ep, EPOLL_CTL_ADD, sv[0], &e);
	}
	else {
		fdc_insert(t, sv[0], 0x98, 0, 1, 1, 0);
		fdc_want_recv(th, sv[0]);
	}
	atomic_store(&stop_flag, 0);
	pthread_create(&pt, NULL, busy_writer, &wr);
	pin(0);
	t0 = now();
	while ((el = now() - t0) < opt_secs) {
		int m;

		if (raw)
			m = epoll_wait(ep, eev, 8, 100);
		else
			m = fdc_poll(th, 100, ev, 8);
		for (int i = 0; i < m; i++) {
			ssize_t r;

			while ((r = read(sv[0], buf, sizeof(buf))) > 0)
				bytes += (uint64_t)r;
			if (!raw) {
				if (r < 0 && errno == EAGAIN)
					fdc_cant_recv(th, sv[0]);
				fdc_leave(th, ev[i].fd, ev[i].gen);
			}
			events++;
		}
	}
	atomic_store(&stop_flag, 1);
	/* drain so the writer can see the flag */
	shutdown(sv[0], SHUT_RD);
	pthread_join(pt, NULL);
	row("busy", opt_variant, 2, events, el, "\"bytes\":%llu,\"MBps\":%.1f",
	    (unsigned long long)bytes, bytes / el / 1e6);
	if (raw)
		close(sv[0]);
	else
		fdc_delete(th, sv[0]);
	close(sv[1]);
	close(ep);
	fdc_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* 4c. listener wake-up efficiency: --threads pollers share one listener
 * (thread_mask = all), optionally EXCLUSIVE; --clients threads connect and
 * close (RST, no TIME_WAIT) as fast as they can.
 */
static int lst_fd;
static struct sockaddr_in lst_addr;

static void *lst_server(void *p)
{
	struct worker *w = p;
	struct fdc_event ev[64];
	int conns[64];

	pin(w->idx);
	pthread_barrier_wait(&start_bar);
	while (!stopped()) {
		int m = fdc_poll(w->th, 50, ev, 64);

		for (int i = 0; i < m; i++) {
			if (ev[i].fd == lst_fd) {
				int k = fdc_accept(w->th, lst_fd, conns, 64);

				for (int j = 0; j < k; j++) {
					/* RST: no TIME_WAIT piling up on either side */
					static const struct linger lg = { 1, 0 };

					setsockopt(conns[j], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
					close(conns[j]);
				}
			}
			fdc_leave(w->th, ev[i].fd, ev[i].gen);
		}
	}
	return NULL;
}

static void *lst_client(void *p)
{
	struct worker *w = p;
	struct linger lg = { 1, 0 };

	pin(w->idx);
	pthread_barrier_wait(&start_bar);
	while (!stopped()) {
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

		if (s < 0) {
			w->other++;
			continue;
		}
		if (connect(s, (struct sockaddr *)&lst_addr, sizeof(lst_addr)) == 0)
			w->ops++;
		else
			w->other++;
		setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
		close(s);
		if (opt_pace_us)
			usleep((useconds_t)opt_pace_us);
	}
	return NULL;
}

static void mode_listener(void)
{
	int M = opt_threads, C = opt_clients;
	struct fdc_table *t = table(1 << 16, M, 1);
	struct worker w[64 + 64];
	socklen_t sl = sizeof(lst_addr);
	int one = 1;
	uint64_t accepted = 0, empty = 0, loops = 0, nowork = 0, wakeups = 0, polls_io = 0, conn = 0, cerr = 0;
	double t0, el;

	memset(w, 0, sizeof(w));
	lst_fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	setsockopt(lst_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&lst_addr, 0, sizeof(lst_addr));
	lst_addr.sin_family = AF_INET;
	lst_addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(lst_fd, (struct sockaddr *)&lst_addr, sizeof(lst_addr)) || listen(lst_fd, 4096))
		die("bind/listen: %s", strerror(errno));
	getsockname(lst_fd, (struct sockaddr *)&lst_addr, &sl);
	if (fdc_insert(t, lst_fd, 0x4c, 1, 1, (1ULL << M) - 1, opt_excl ? FDC_EXCLUSIVE : 0))
		die("insert listener");
	fdc_want_recv(fdc_thread(t, 0), lst_fd);

	atomic_store(&stop_flag, 0);
	pthread_barrier_init(&start_bar, NULL, (unsigned)(M + C + 1));
	for (int i = 0; i < M; i++) {
		w[i].idx = i;
		w[i].t = t;
		w[i].th = fdc_thread(t, i);
		pthread_create(&w[i].pt, NULL, lst_server, &w[i]);
	}
	for (int i = 0; i < C; i++) {
		w[M + i].idx = i;
		pthread_create(&w[M + i].pt, NULL, lst_client, &w[M + i]);
	}
	pthread_barrier_wait(&start_bar);
	t0 = now();
	usleep((useconds_t)(opt_secs * 1e6));
	atomic_store(&stop_flag, 1);
	el = now() - t0;
	for (int i = 0; i < C; i++) {
		pthread_join(w[M + i].pt, NULL);
		conn += w[M + i].ops;
		cerr += w[M + i].other;
	}
	for (int i = 0; i < M; i++)
		fdc_wake(t, i);
	for (int i = 0; i < M; i++) {
		struct fdc_counters c;

		pthread_join(w[i].pt, NULL);
		fdc_counters(w[i].th, &c);
		accepted += c.accepted;
		empty += c.accept_empty;
		loops += c.loops;
		nowork += c.wake_nowork;
		wakeups += c.wakeups;
		polls_io += c.poll_io;
	}
	pthread_barrier_destroy(&start_bar);
	row("listener", opt_excl ? "exclusive" : "shared", M, accepted, el,
	    "\"pace_us\":%d,\"clients\":%d,\"connects\":%llu,\"connect_errors\":%llu,\"accept_empty\":%llu,"
	    "\"empty_per_accepted\":%.4f,\"loops\":%llu,\"poll_io\":%llu,\"wake_nowork\":%llu,"
	    "\"loops_per_accepted\":%.4f",
	    opt_pace_us, C, (unsigned long long)conn, (unsigned long long)cerr, (unsigned long long)empty,
	    accepted ? (double)empty / accepted : 0.0, (unsigned long long)loops,
	    (unsigned long long)polls_io, (unsigned long long)nowork,
	    accepted ? (double)loops / accepted : 0.0);
	fdc_delete(fdc_thread(t, 0), lst_fd);
	fdc_table_free(t);
}

/* ------------------------------------------------------------------------ */
/* 6. stress: random insert/delete/takeover/enter/leave/want/stop/poll on a
 * pool of real fds with immediate number reuse, checking invariants.
 */

#define ST_MAXFD 4096
static struct fdc_table *st_t;
static int st_lo, st_range, st_pool, st_base;
static _Atomic int st_live;
static _Atomic uint64_t st_cookie[ST_MAXFD];
static _Atomic uint32_t st_closes[ST_MAXFD];
static _Atomic uint64_t st_violations, st_ops_total;
static struct { _Atomic uint64_t v; char pad[56]; } st_closed_by[256], st_inserted_by[256];
static _Atomic uint64_t st_cookie_seq = 1;

/* violation kinds, for the summary */
static const char *const vk_name[] = { "close", "insert_unclean", "mask", "running", "incarnation",
                                       "update", "epoll", "hang", "other" };
#define VK_N 9
static _Atomic uint64_t vk_count[VK_N];

static int vk_of(const char *fmt)
{
	if (strstr(fmt, "close of fd") || strstr(fmt, "closes seen") || strstr(fmt, "inserts but") ||
	    strstr(fmt, "still open"))
		return 0;
	if (strstr(fmt, "insert of fresh"))
		return 1;
	if (strstr(fmt, "missing from thread_mask") || strstr(fmt, "succeeded while"))
		return 2;
	if (strstr(fmt, "running bit"))
		return 3;
	if (strstr(fmt, "changed"))
		return 4;
	if (strstr(fmt, "update"))
		return 5;
	if (strstr(fmt, "epoll"))
		return 6;
	if (strstr(fmt, "HANG"))
		return 7;
	return 8;
}

static const char *vk_json(void)
{
	static char buf[512];
	int o = 0;

	o += snprintf(buf + o, sizeof(buf) - (size_t)o, "{");
	for (int i = 0; i < VK_N; i++)
		o += snprintf(buf + o, sizeof(buf) - (size_t)o, "%s\"%s\":%llu", i ? "," : "", vk_name[i],
		              (unsigned long long)atomic_load(&vk_count[i]));
	snprintf(buf + o, sizeof(buf) - (size_t)o, "}");
	return buf;
}

static void violation(const char *fmt, ...)
{
	va_list ap;
	int kind = vk_of(fmt);
	uint64_t n;

	atomic_fetch_add(&st_violations, 1);
	/* at most 10 messages of each kind */
	n = atomic_fetch_add(&vk_count[kind], 1);

	if (n < 10) {
		va_start(ap, fmt);
		fprintf(stderr, "VIOLATION: ");
		vfprintf(stderr, fmt, ap);
		fprintf(stderr, "\n");
		va_end(ap);
	}
}

static void st_hook(void *arg, int point, int tid, int fd, uint32_t gen)
{
	(void)arg;
	if (point != FDC_HK_CLOSE_END)
		return;
	if (fd < 0 || fd >= ST_MAXFD) {
		violation("close hook for fd %d out of range", fd);
		return;
	}
	uint32_t c = atomic_fetch_add(&st_closes[fd], 1);

	if (c != gen)
		violation("close of fd %d gen %u, but %u closes already seen (double or lost close)",
		          fd, gen, c);
	atomic_fetch_add_explicit(&st_closed_by[tid].v, 1, memory_order_relaxed);
	atomic_fetch_sub(&st_live, 1);
}

static inline uint64_t xs(uint64_t *s)
{
	uint64_t x = *s;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *s = x;
}

/* checks made while th holds a running bit on fd for incarnation gen */
static void st_check_inside(struct fdc_thread *th, int fd, uint32_t gen, const char *where)
{
	struct fdc_entry *e = &st_t->fdtab[fd];
	int tgid, ltid, epfd;
	uint64_t bit, tm, rm;

	fdc_thread_info(th, &tgid, &ltid, &epfd);
	bit = 1ULL << ltid;
	tm = atomic_load(&e->thread_mask);
	rm = atomic_load(&e->running_mask);
	if (tm && !(tm & bit))
		violation("%s: fd %d running on ltid %d missing from thread_mask %#llx", where, fd, ltid,
		          (unsigned long long)tm);
	if (!(rm & bit))
		violation("%s: fd %d: own running bit %#llx lost (running %#llx)", where, fd,
		          (unsigned long long)bit, (unsigned long long)rm);
	if (atomic_load(&e->generation) != gen)
		violation("%s: fd %d generation changed under a running bit (%u -> %u)", where, fd, gen,
		          atomic_load(&e->generation));
	if ((atomic_load(&e->refc_tgid) & FDC_TGID_MASK) != (uint32_t)tgid)
		violation("%s: fd %d tgid changed under a running bit", where, fd);
}

static int st_clone_src;

static void st_insert(struct worker *w, uint64_t r)
{
	int tgid, ltid, epfd, fd, ngr = st_t->nbgroup, g, cnt;
	uint64_t mask, cookie;
	int cloned = (r >> 20) % 4 == 0;
	int rc;

	if (atomic_fetch_add(&st_live, 1) >= st_pool) {
		atomic_fetch_sub(&st_live, 1);
		return;
	}
	fdc_thread_info(w->th, &tgid, &ltid, &epfd);
	fd = cloned ? fcntl(st_clone_src, F_DUPFD_CLOEXEC, 0)
	            : eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);   /* readable */
	if (fd < 0) {
		atomic_fetch_sub(&st_live, 1);
		violation("create fd: %s", strerror(errno));
		return;
	}
	if (fd < st_lo || fd >= st_lo + st_range)
		violation("fresh fd %d outside the pool range [%d, %d): leaked numbers?", fd, st_lo,
		          st_lo + st_range);
	/* mostly our own group, sometimes another one */
	g = ((r >> 24) % 8 == 0) ? 1 + (int)((r >> 28) % (uint64_t)ngr) : tgid;
	cnt = st_t->groups[g].count;
	mask = opt_shared ? (r >> 32) & ((cnt == 64) ? ~0ULL : (1ULL << cnt) - 1) : 0;
	if (!mask)
		mask = 1ULL << ((r >> 40) % (uint64_t)cnt);
	cookie = atomic_fetch_add(&st_cookie_seq, 1);
	rc = fdc_insert(st_t, fd, cookie, 7, g, mask, cloned ? FDC_CLONED : 0);
	w->ops++;
	if (rc) {
		struct fdc_fdinfo fi;

		fdc_dump(st_t, fd, &fi);
		violation("insert of fresh fd %d failed: %s (entry not clean after close: I5): "
		          "tgid %u refcount %u state %#x gen %u closes_seen %u owner %llu running %#llx "
		          "thread %#llx update %#llx polled %#llx/%#llx", fd, strerror(-rc),
		          fi.tgid, fi.refcount, fi.state, fi.generation, atomic_load(&st_closes[fd]),
		          (unsigned long long)fi.owner, (unsigned long long)fi.running_mask,
		          (unsigned long long)fi.thread_mask, (unsigned long long)fi.update_mask,
		          (unsigned long long)fi.polled_recv, (unsigned long long)fi.polled_send);
		close(fd);
		atomic_fetch_sub(&st_live, 1);
		return;
	}
	atomic_store(&st_cookie[fd], cookie);
	atomic_fetch_add_explicit(&st_inserted_by[w->idx].v, 1, memory_order_relaxed);
}

static void st_dirverb(struct worker *w, int fd, uint64_t r)
{
	static int (*const verbs[])(struct fdc_thread *, int) = {
		fdc_want_recv, fdc_stop_recv, fdc_want_send, fdc_stop_send,
		fdc_may_recv, fdc_cant_recv, fdc_want_recv, fdc_stop_send,
	};
	verbs[r % 8](w->th, fd);
	w->ops++;
}

/* handler body while holding fd: random inner op, then leave */
static void st_inside(struct worker *w, int fd, uint32_t gen, uint64_t r)
{
	int deleted = 0, rc;

	st_check_inside(w->th, fd, gen, "enter");
	switch ((r >> 12) % 8) {
	case 0:
		fdc_delete(w->th, fd);
		deleted = 1;
		w->ops++;
		break;
	case 1:
		rc = fdc_takeover(w->th, fd, atomic_load(&st_cookie[fd]));
		if (rc == 0)
			violation("takeover of fd %d succeeded while the taker itself was inside", fd);
		w->ops++;
		break;
	case 2: case 3: case 4:
		st_dirverb(w, fd, r >> 16);
		break;
	default:
		break;
	}
	if (!deleted)
		st_check_inside(w->th, fd, gen, "before leave");
	rc = fdc_leave(w->th, fd, gen);
	w->ops++;
	if (deleted && rc == FDC_DONE)
		violation("leave of fd %d after own delete returned DONE", fd);
}

static void *stress_fn(void *p)
{
	struct worker *w = p;
	uint64_t s = 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(w->idx + 1) * 0xbf58476d1ce4e5b9ULL);
	struct fdc_event ev[64];
	uint64_t last = 0;
	double t0;

	BEGIN(w);
	t0 = now();
	while (!stopped()) {
		uint64_t r = xs(&s);
		int op = (int)(r % 100);
		int fd = st_lo + (int)((r >> 8) % (uint64_t)st_range);
		uint32_t gen;
		int rc;

		if (op < 14) {
			st_insert(w, r);
		}
		else if (op < 24) {
			fdc_delete(w->th, fd);
			w->ops++;
		}
		else if (op < 40) {
			rc = fdc_takeover(w->th, fd, atomic_load(&st_cookie[fd]));
			w->ops++;
			if (rc == 0)
				w->ok++;
		}
		else if (op < 70) {
			rc = fdc_enter(w->th, fd, &gen);
			w->ops++;
			if (rc == FDC_DONE)
				st_inside(w, fd, gen, r);
		}
		else if (op < 88) {
			if (opt_blind) {
				st_dirverb(w, fd, r >> 16);
			}
			else if (fdc_enter(w->th, fd, &gen) == FDC_DONE) {
				/* verb on a held fd only */
				w->ops++;
				st_dirverb(w, fd, r >> 16);
				/* CLOSED / MIGRATED are fine: another thread may have
				 * deleted it meanwhile, and then we are the last runner */
				fdc_leave(w->th, fd, gen);
				w->ops++;
			}
			else {
				w->ops++;
			}
		}
		else {
			int m = fdc_poll(w->th, 0, ev, 64);

			w->ops++;
			if (m < 0)
				violation("fdc_poll: %s", strerror(-m));
			for (int i = 0; i < m; i++) {
				uint64_t r2 = xs(&s);

				if (ev[i].fd < st_lo || ev[i].fd >= st_lo + st_range)
					violation("event for fd %d outside the pool", ev[i].fd);
				w->bytes++;
				st_inside(w, ev[i].fd, ev[i].gen, r2);
			}
		}
		if (w->ops - last >= 4096) {
			uint64_t tot = atomic_fetch_add(&st_ops_total, w->ops - last) + (w->ops - last);

			last = w->ops;
			if (tot >= opt_stress_ops)
				atomic_store(&stop_flag, 1);
		}
	}
	atomic_fetch_add(&st_ops_total, w->ops - last);
	w->el = now() - t0;
	return NULL;
}

static int open_in_range(void)
{
	int n = 0;

	for (int fd = st_lo; fd < st_lo + st_range; fd++)
		if (fcntl(fd, F_GETFD) >= 0)
			n++;
	return n;
}

static void mode_stress(void)
{
	int n = opt_threads, ngr = opt_groups;
	struct worker w[64];
	int sv[2];
	double t0, el, lastp;
	uint64_t inserted = 0, closed = 0, takeovers = 0, events = 0, left = 0;

	memset(w, 0, sizeof(w));
	st_t = table(ST_MAXFD, n, ngr);
	fdc_set_hook(st_t, st_hook, NULL);
	/* clone source: a connected socket with data pending (readable and
	 * writable), whose dups are CLONED */
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair");
	(void)!write(sv[1], "x", 1);
	st_clone_src = sv[0];
	st_pool = opt_pool;
	/* numbers handed out from here on belong to the pool */
	st_lo = fcntl(0, F_DUPFD_CLOEXEC, 0);
	close(st_lo);
	st_range = st_pool + 2 * n + 2;
	if (st_lo + st_range > ST_MAXFD)
		die("fd range too high");
	st_base = open_in_range();
	for (int i = 0; i < n; i++) {
		w[i].idx = i;
		w[i].t = st_t;
		w[i].th = fdc_thread(st_t, i);
	}
	atomic_store(&stop_flag, 0);
	pthread_barrier_init(&start_bar, NULL, (unsigned)n + 1);
	for (int i = 0; i < n; i++)
		pthread_create(&w[i].pt, NULL, stress_fn, &w[i]);
	pthread_barrier_wait(&start_bar);
	t0 = lastp = now();
	uint64_t wd_ops = 0;
	double wd_t = t0;

	while (!stopped()) {
		usleep(100000);
		if (atomic_load(&st_ops_total) != wd_ops) {
			wd_ops = atomic_load(&st_ops_total);
			wd_t = now();
		}
		else if (now() - wd_t >= opt_hang_secs) {
			atomic_fetch_add(&st_violations, 1);
			atomic_fetch_add(&vk_count[7], 1);
			fprintf(stderr, "VIOLATION: HANG: no progress for %.0f s at %llu ops\n",
			        opt_hang_secs, (unsigned long long)wd_ops);
			for (int g = 1; g <= ngr; g++)
				fprintf(stderr, "  group %d shared list: first %d last %d epoch %u\n", g,
				        atomic_load(&st_t->groups[g].first), atomic_load(&st_t->groups[g].last),
				        atomic_load(&st_t->groups[g].epoch));
			for (int fd = st_lo; fd < st_lo + st_range; fd++) {
				struct fdc_entry *e = &st_t->fdtab[fd];
				uint64_t lk = atomic_load(&e->links);
				int32_t nx = (int32_t)(uint32_t)lk, pv = (int32_t)(uint32_t)(lk >> 32);

				if (nx >= -2)
					fprintf(stderr, "  fd %d links next %d prev %d refc_tgid %#x update %#llx\n",
					        fd, nx, pv, atomic_load(&e->refc_tgid),
					        (unsigned long long)atomic_load(&e->update_mask));
			}
			for (int g = 1; g <= ngr; g++) {
				int f = atomic_load(&st_t->groups[g].first);

				if (f >= 0) {
					uint64_t lk = atomic_load(&st_t->fdtab[f].links);

					fprintf(stderr, "  group %d head fd %d: links next %d prev %d refc_tgid %#x%s\n",
					        g, f, (int32_t)(uint32_t)lk, (int32_t)(uint32_t)(lk >> 32),
					        atomic_load(&st_t->fdtab[f].refc_tgid),
					        (int32_t)(uint32_t)lk <= -3 ? "  <-- head is NOT in the list" : "");
				}
			}
			fprintf(stderr, "  all entries (fd:tgid/next/prev):");
			for (int fd = st_lo; fd < st_lo + st_range; fd++) {
				uint64_t lk = atomic_load(&st_t->fdtab[fd].links);

				fprintf(stderr, " %d:%u/%d/%d", fd, atomic_load(&st_t->fdtab[fd].refc_tgid) & FDC_TGID_MASK,
				        (int32_t)(uint32_t)lk, (int32_t)(uint32_t)(lk >> 32));
			}
			fprintf(stderr, "\n");
			for (int g = 1; g <= ngr; g++) {
				int l = atomic_load(&st_t->groups[g].last);

				if (l >= 0) {
					uint64_t lk = atomic_load(&st_t->fdtab[l].links);

					fprintf(stderr, "  group %d tail fd %d: links next %d prev %d%s\n", g, l,
					        (int32_t)(uint32_t)lk, (int32_t)(uint32_t)(lk >> 32),
					        (int32_t)(uint32_t)lk <= -3 ? "  <-- tail is NOT in the list" : "");
				}
			}
			row("stress", "random", n, wd_ops, now() - t0,
			    "\"groups\":%d,\"pool\":%d,\"blind_verbs\":%d,\"shared\":%d,\"hang\":1,"
			    "\"violations\":%llu,\"by_kind\":%s", ngr, st_pool, opt_blind, opt_shared,
			    (unsigned long long)atomic_load(&st_violations), vk_json());
			fflush(stderr);
			_exit(3);
		}
		if (now() - lastp >= 10.0) {
			lastp = now();
			fprintf(stderr, "stress: %.0fs %llu ops %.2fM ops/s violations %llu\n",
			        lastp - t0, (unsigned long long)atomic_load(&st_ops_total),
			        atomic_load(&st_ops_total) / (lastp - t0) / 1e6,
			        (unsigned long long)atomic_load(&st_violations));
		}
		if (now() - t0 >= opt_stress_secs)
			atomic_store(&stop_flag, 1);
	}
	for (int i = 0; i < n; i++)
		pthread_join(w[i].pt, NULL);
	el = now() - t0;
	pthread_barrier_destroy(&start_bar);

	/* end checks, single-threaded: no running bit or reference left */
	for (int fd = st_lo; fd < st_lo + st_range; fd++) {
		struct fdc_entry *e = &st_t->fdtab[fd];

		if (atomic_load(&e->running_mask))
			violation("end: fd %d running bit left %#llx", fd,
			          (unsigned long long)atomic_load(&e->running_mask));
		if (atomic_load(&e->refc_tgid) & FDC_REF_MASK)
			violation("end: fd %d reference left", fd);
	}
	/* update bits consumable: each context's pass consumes its bits */
	for (int round = 0; round < 2; round++)
		for (int i = 0; i < n; i++)
			fdc_update_pass(fdc_thread(st_t, i));
	for (int fd = st_lo; fd < st_lo + st_range; fd++) {
		struct fdc_entry *e = &st_t->fdtab[fd];

		if (atomic_load(&e->update_mask))
			violation("end: fd %d update bits %#llx not consumed by their threads' passes", fd,
			          (unsigned long long)atomic_load(&e->update_mask));
	}
	for (int g = 1; g <= ngr; g++)
		if (atomic_load(&st_t->groups[g].first) != -1)
			violation("end: group %d shared update list not empty (first %d)", g,
			          atomic_load(&st_t->groups[g].first));
	/* delete what is left: each must close now */
	for (int fd = st_lo; fd < st_lo + st_range; fd++) {
		struct fdc_fdinfo fi;

		fdc_dump(st_t, fd, &fi);
		if (!fi.tgid)
			continue;
		left++;
		if (fdc_delete(fdc_thread(st_t, st_t->groups[fi.tgid].base), fd) != 1)
			violation("end: delete of idle fd %d did not close it", fd);
	}
	/* pollers: one more pass, then nothing but wake-ups may report (a stale
	 * registration of a cloned fd would) */
	for (int i = 0; i < n; i++) {
		struct fdc_thread *th = fdc_thread(st_t, i);
		struct epoll_event eev[16];
		int tg, lt, epfd, m;

		fdc_update_pass(th);
		fdc_thread_info(th, &tg, &lt, &epfd);
		m = epoll_wait(epfd, eev, 16, 0);
		for (int k = 0; k < m; k++)
			if (eev[k].data.u64 != UINT64_MAX)
				violation("end: thread %d epoll still reports fd %u gen %u after all closes", i,
				          (unsigned)(uint32_t)eev[k].data.u64,
				          (unsigned)(eev[k].data.u64 >> 32));
	}
	for (int i = 0; i < 256; i++) {
		inserted += atomic_load(&st_inserted_by[i].v);
		closed += atomic_load(&st_closed_by[i].v);
	}
	for (int i = 0; i < n; i++) {
		struct fdc_counters c;

		fdc_counters(w[i].th, &c);
		takeovers += c.fd_takeover;
		events += w[i].bytes;
	}
	if (inserted != closed)
		violation("end: %llu inserts but %llu closes", (unsigned long long)inserted,
		          (unsigned long long)closed);
	for (int fd = st_lo; fd < st_lo + st_range; fd++)
		if (atomic_load(&st_closes[fd]) != atomic_load(&st_t->fdtab[fd].generation))
			violation("end: fd %d: %u closes seen, generation %u", fd,
			          atomic_load(&st_closes[fd]), atomic_load(&st_t->fdtab[fd].generation));
	if (open_in_range() != st_base)
		violation("end: %d fds still open in the pool range (lost closes)", open_in_range() - st_base);
	row("stress", "random", n, atomic_load(&st_ops_total), el,
	    "\"groups\":%d,\"pool\":%d,\"blind_verbs\":%d,\"shared\":%d,\"hang\":0,\"inserts\":%llu,\"closes\":%llu,\"takeovers\":%llu,"
	    "\"events\":%llu,\"left_at_end\":%llu,\"violations\":%llu,\"by_kind\":%s",
	    ngr, st_pool, opt_blind, opt_shared, (unsigned long long)inserted, (unsigned long long)closed,
	    (unsigned long long)takeovers, (unsigned long long)events, (unsigned long long)left,
	    (unsigned long long)atomic_load(&st_violations), vk_json());
	fdc_set_hook(st_t, NULL, NULL);
	fdc_table_free(st_t);
	close(sv[0]);
	close(sv[1]);
}

/* ------------------------------------------------------------------------ */
/* Deterministic / short reproductions of the core bugs the stress run found
 * (see bench/README.md). They print one JSON row each.
 */

/* repro-takeover: fd shared by ltid 0 and 1 (thread_mask 0x3). Thread
 * context 1 takes it over; at FDC_HK_TAKEOVER_OWNED (running CAS'ed, new
 * thread_mask not stored yet) context 0 enters. enter sees no running bit
 * outside thread_mask (the taker is an owner too) and returns DONE; then the
 * takeover stores thread_mask = 0x2: ltid 0 runs on an fd it no longer owns.
 */
static struct fdc_table *rp_t;
static int rp_fd, rp_enter_rc = -1;
static uint32_t rp_gen;

static void rp_hook(void *arg, int point, int tid, int fd, uint32_t gen)
{
	(void)arg;
	(void)gen;
	if (point == FDC_HK_TAKEOVER_OWNED && tid == 1 && fd == rp_fd && rp_enter_rc < 0)
		rp_enter_rc = fdc_enter(fdc_thread(rp_t, 0), rp_fd, &rp_gen);
}

static void mode_repro_takeover(void)
{
	struct fdc_fdinfo fi;
	int tk;

	rp_t = table(1024, 2, 1);
	rp_fd = sock_one();
	if (fdc_insert(rp_t, rp_fd, 0x42, 0, 1, 0x3, 0))
		die("insert");
	fdc_set_hook(rp_t, rp_hook, NULL);
	tk = fdc_takeover(fdc_thread(rp_t, 1), rp_fd, 0x42);
	fdc_set_hook(rp_t, NULL, NULL);
	fdc_dump(rp_t, rp_fd, &fi);
	printf("{\"mode\":\"repro-takeover\",\"takeover_rc\":%d,\"enter_rc\":%d,"
	       "\"thread_mask\":%llu,\"running_mask\":%llu,\"violation\":%d}\n", tk, rp_enter_rc,
	       (unsigned long long)fi.thread_mask, (unsigned long long)fi.running_mask,
	       tk == 0 && rp_enter_rc == FDC_DONE && (fi.running_mask & 1) && !(fi.thread_mask & 1));
	if (rp_enter_rc == FDC_DONE)
		fdc_leave(fdc_thread(rp_t, 0), rp_fd, rp_gen);
	fdc_delete(fdc_thread(rp_t, 1), rp_fd);
	fdc_table_free(rp_t);
}

/* repro-insert: thread A inserts and deletes one number (DISOWN, so the
 * number stays ours) in a loop; thread B calls want_recv / may_recv on that
 * number. insert publishes the tgid before it initialises the entry, so B's
 * verb can land in between: insert then fails with EEXIST and leaves the
 * state bits behind, and the number can never be inserted again.
 */
static _Atomic int ri_done;

static void *ri_verbs(void *p)
{
	struct fdc_thread *th = p;

	pin(1);
	while (!atomic_load_explicit(&ri_done, memory_order_relaxed)) {
		fdc_want_recv(th, rp_fd);
		fdc_may_recv(th, rp_fd);
	}
	return NULL;
}

static void mode_repro_insert(void)
{
	uint64_t ok = 0, fail = 0, iters = 0;
	double t0 = now();
	struct fdc_fdinfo fi;
	pthread_t pt;

	rp_t = table(1024, 2, 1);
	rp_fd = sock_one();
	pthread_create(&pt, NULL, ri_verbs, fdc_thread(rp_t, 1));
	pin(0);
	while (now() - t0 < opt_secs && !fail) {
		for (int k = 0; k < 1000; k++) {
			iters++;
			if (fdc_insert(rp_t, rp_fd, 0x43, 0, 1, 1, FDC_DISOWN) == 0) {
				ok++;
				fdc_delete(fdc_thread(rp_t, 0), rp_fd);
			}
			else {
				fail++;
				break;
			}
		}
	}
	atomic_store(&ri_done, 1);
	pthread_join(pt, NULL);
	fdc_dump(rp_t, rp_fd, &fi);
	/* one more try, alone now: a clean table would accept it */
	int again = fdc_insert(rp_t, rp_fd, 0x44, 0, 1, 1, FDC_DISOWN);

	printf("{\"mode\":\"repro-insert\",\"iterations\":%llu,\"inserts_ok\":%llu,"
	       "\"first_failure_after\":%llu,\"state_left\":%u,\"tgid_left\":%u,"
	       "\"insert_alone_after\":%d,\"violation\":%d}\n", (unsigned long long)iters,
	       (unsigned long long)ok, fail ? (unsigned long long)ok : 0ULL, fi.state, fi.tgid, again,
	       fail && again != 0);
	if (again == 0)
		fdc_delete(fdc_thread(rp_t, 0), rp_fd);
	close(rp_fd);
	fdc_table_free(rp_t);
}

/* ------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
	const char *mode;

	if (argc < 2)
		die("usage: %s MODE [options] (see the file header)", argv[0]);
	mode = argv[1];
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--no-pin")) { opt_pin = 0; continue; }
		if (!strcmp(a, "--same-cpu")) { opt_same_cpu = 1; continue; }
		if (!v)
			die("option %s needs a value", a);
		i++;
		if (!strcmp(a, "--secs")) opt_secs = atof(v);
		else if (!strcmp(a, "--threads")) opt_threads = atoi(v);
		else if (!strcmp(a, "--groups")) opt_groups = atoi(v);
		else if (!strcmp(a, "--pool")) opt_pool = atoi(v);
		else if (!strcmp(a, "--fds")) opt_fds = atoi(v);
		else if (!strcmp(a, "--clients")) opt_clients = atoi(v);
		else if (!strcmp(a, "--excl")) opt_excl = atoi(v);
		else if (!strcmp(a, "--pace-us")) opt_pace_us = atoi(v);
		else if (!strcmp(a, "--variant")) opt_variant = v;
		else if (!strcmp(a, "--stress-ops")) opt_stress_ops = strtoull(v, NULL, 10);
		else if (!strcmp(a, "--stress-secs")) opt_stress_secs = atof(v);
		else if (!strcmp(a, "--blind-verbs")) opt_blind = atoi(v);
		else if (!strcmp(a, "--shared")) opt_shared = atoi(v);
		else if (!strcmp(a, "--hang-secs")) opt_hang_secs = atof(v);
		else die("unknown option %s", a);
	}
	if (opt_threads < 1 || opt_threads > 64)
		die("--threads 1..64");
	cpu0 = cpu_secs();
	signal(SIGPIPE, SIG_IGN);   /* busy: the writer sees EPIPE at the end */
	if (!strcmp(mode, "insdel")) mode_insdel();
	else if (!strcmp(mode, "takeover")) mode_takeover();
	else if (!strcmp(mode, "atomic")) mode_atomic();
	else if (!strcmp(mode, "enterleave")) mode_enterleave();
	else if (!strcmp(mode, "wake")) mode_wake();
	else if (!strcmp(mode, "events")) mode_events();
	else if (!strcmp(mode, "busy")) mode_busy();
	else if (!strcmp(mode, "listener")) mode_listener();
	else if (!strcmp(mode, "stress")) mode_stress();
	else if (!strcmp(mode, "repro-takeover")) mode_repro_takeover();
	else if (!strcmp(mode, "repro-insert")) mode_repro_insert();
	else die("unknown mode %s", mode);
	return 0;
}
