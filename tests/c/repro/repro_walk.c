/* Deterministic reproduction of issue 6, bug 2: a shared-list walker carried
 * past an update by a removed and re-added entry must walk again.
 *
 * The interleaving of tests/fdcore/test_fd_last_runner_walk_report_disown.py
 * (test_bug2_walker_carried_past_an_update_walks_again), driven with real
 * pthreads and the core's step hook (fdc_set_hook):
 *   group of 3 threads: W (tid 0) walks, R (tid 1) removes, S (tid 2) makes
 *   the changes as a non-owner (so they go through the shared list).
 *   A is inserted for R, B for W; S wants recv on both: the shared list is
 *   A -> B, A holding R's update bit, B holding W's.
 *   1. R's update pass consumes its bit on A and removes A; R stops at
 *      FDC_HK_LIST_UNLINK, A and its neighbours locked, A not yet unlinked.
 *   2. W's update pass starts (reads the group's removal counter, then
 *      `first`, still A) and stops at FDC_HK_WALK_ARRIVE on A.
 *   3. R unlinks A and finishes its pass; S wants send on A, which puts A
 *      back on the list, at the tail, behind B.
 *   4. W steps from A: A is the tail now, the walk ends without seeing B.
 *      The removal counter moved after W read it (the fix: the removal bumps
 *      it only once A is out), so W walks again and consumes B's update.
 *      With the counter bumped before the unlink (the bug), W read it after
 *      the bump, sees no change and ends its pass with B's update pending:
 *      its poller would sleep through it.
 * Exit status: 0 if W's pass consumed B's update (and registered B in W's
 * epoll instance), 1 if not ("FAIL: ..."), 2 if the interleaving could not
 * be driven (a step did not happen within 10 s, or a set-up error).
 *
 * Its own program (not part of the stress binary):
 *   gcc -std=gnu11 -O1 -g -pthread -fsanitize=address,undefined -I fdcore \
 *       fdcore/*.c tests/c/repro/repro_walk.c -o /tmp/repro_walk
 * Built and run by tests/test_c_sanitizers.py (clean core: must pass) and by
 * tests/test_c_mutations.py (bug 2 re-injected: must fail).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fd.h"

enum { W = 0, R = 1, S = 2 };

static struct fdc_table *g_t;
static int g_a = -1, g_b = -1;
static sem_t g_locked;    /* R holds A and its neighbours locked */
static sem_t g_unlink;    /* R may unlink A */
static sem_t g_removed;   /* R's pass is over */
static _Atomic int g_armed_unlink = 1, g_armed_arrive = 1;
static _Atomic int g_r_hook_ran, g_w_hook_ran;

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "SETUP: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(2);
}

static void wait10(sem_t *s, const char *what)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 10;
	while (sem_timedwait(s, &ts) < 0) {
		if (errno == EINTR)
			continue;
		die("%s did not happen within 10 s (%s)", what, strerror(errno));
	}
}

static struct fdc_thread *th(int tid) { return fdc_thread(g_t, tid); }

static void hook(void *arg, int point, int tid, int fd, uint32_t gen)
{
	(void)arg;
	(void)gen;
	if (point == FDC_HK_LIST_UNLINK && fd == g_a && atomic_exchange(&g_armed_unlink, 0)) {
		/* R, inside its removal of A: hold it here until W stands on A */
		atomic_store(&g_r_hook_ran, 1);
		sem_post(&g_locked);
		wait10(&g_unlink, "W's arrival on A");
		return;
	}
	if (point == FDC_HK_WALK_ARRIVE && tid == W && fd == g_a &&
	    atomic_exchange(&g_armed_arrive, 0)) {
		/* W standing on A, counter and head read: let R unlink A and
		 * finish, then A is re-added at the tail, behind B */
		atomic_store(&g_w_hook_ran, 1);
		sem_post(&g_unlink);
		wait10(&g_removed, "the end of R's pass");
		int rc = fdc_want_send(th(S), g_a);
		if (rc < 0)
			die("want_send(A): %s", strerror(-rc));
		if (!fdc_in_shared_list(g_t, g_a))
			die("A is not back on the shared list");
	}
}

static void *r_pass(void *arg)
{
	(void)arg;
	fdc_update_pass(th(R));
	sem_post(&g_removed);
	return NULL;
}

/* events of fd's registration in epoll instance epfd, -1 if none
 * (/proc/self/fdinfo: "tfd: N events: X data: Y") */
static long kernel_events(int epfd, int fd)
{
	char path[64], line[512];
	long found = -1;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", epfd);
	FILE *f = fopen(path, "r");
	if (!f)
		die("fopen %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		int tfd;
		unsigned ev;
		if (sscanf(line, "tfd: %d events: %x", &tfd, &ev) == 2 && tfd == fd)
			found = ev;
	}
	fclose(f);
	return found;
}

static int pair(int *peer)
{
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		die("socketpair: %s", strerror(errno));
	*peer = sv[1];
	return sv[0];
}

int main(void)
{
	int err = 0, rc, pa, pb, tgid, ltid, epfd_w;
	struct fdc_fdinfo fi;
	pthread_t r;

	g_t = fdc_table_new(1024, 3, 1, &err);
	if (!g_t)
		die("fdc_table_new: %s", strerror(-err));
	if (sem_init(&g_locked, 0, 0) || sem_init(&g_unlink, 0, 0) || sem_init(&g_removed, 0, 0))
		die("sem_init: %s", strerror(errno));
	g_a = pair(&pa);
	g_b = pair(&pb);
	if ((rc = fdc_insert(g_t, g_a, 0xA, 1, 1, 1ull << R, 0)) < 0 ||
	    (rc = fdc_insert(g_t, g_b, 0xB, 1, 1, 1ull << W, 0)) < 0)
		die("fdc_insert: %s", strerror(-rc));
	/* changes made by a non-owner: both go on the shared list, A first */
	if ((rc = fdc_want_recv(th(S), g_a)) < 0 || (rc = fdc_want_recv(th(S), g_b)) < 0)
		die("want_recv: %s", strerror(-rc));
	if (!fdc_in_shared_list(g_t, g_a) || !fdc_in_shared_list(g_t, g_b))
		die("A and B are not both on the shared list");
	fdc_set_hook(g_t, hook, NULL);

	if (pthread_create(&r, NULL, r_pass, NULL))
		die("pthread_create");
	/* W's pass starts once R holds A locked (on the fixed core, before R
	 * has moved the removal counter; on the old one, just after) */
	wait10(&g_locked, "R's unlink of A");
	fdc_update_pass(th(W));
	if (pthread_join(r, NULL))
		die("pthread_join");
	fdc_set_hook(g_t, NULL, NULL);
	if (!atomic_load(&g_r_hook_ran) || !atomic_load(&g_w_hook_ran))
		die("the interleaving was not driven (R hook %d, W hook %d)",
		    atomic_load(&g_r_hook_ran), atomic_load(&g_w_hook_ran));

	int failed = 0;
	if (fdc_dump(g_t, g_b, &fi) < 0)
		die("fdc_dump");
	fdc_thread_info(th(W), &tgid, &ltid, &epfd_w);
	if (fi.update_mask & (1ull << W)) {
		fprintf(stderr, "FAIL: W's update pass ended with its update bit on B (fd %d, update_mask"
		                " %#llx): W was carried past B and did not walk again; its poller would"
		                " sleep through B's update (issue 6, bug 2)\n",
		        g_b, (unsigned long long)fi.update_mask);
		failed = 1;
	}
	if (!(fi.polled_recv & (1ull << W))) {
		fprintf(stderr, "FAIL: B is not polled for recv by W (polled_recv %#llx)\n",
		        (unsigned long long)fi.polled_recv);
		failed = 1;
	}
	long ev = kernel_events(epfd_w, g_b);
	if (ev < 0 || !(ev & EPOLLIN)) {
		fprintf(stderr, "FAIL: W's epoll instance has no EPOLLIN registration of B (%ld)\n", ev);
		failed = 1;
	}
	if (fdc_dump(g_t, g_a, &fi) < 0)
		die("fdc_dump");
	if (!(fi.update_mask & (1ull << R)) || !fdc_in_shared_list(g_t, g_a)) {
		fprintf(stderr, "FAIL: A should hold R's re-armed update on the shared list"
		                " (update_mask %#llx)\n", (unsigned long long)fi.update_mask);
		failed = 1;
	}

	/* clean up: R applies A's update, then both deletes close at once */
	fdc_update_pass(th(R));
	if (fdc_delete(th(S), g_a) != 1 || fdc_delete(th(S), g_b) != 1)
		die("an idle delete did not close at once");
	close(pa);
	close(pb);
	fdc_table_free(g_t);
	sem_destroy(&g_locked);
	sem_destroy(&g_unlink);
	sem_destroy(&g_removed);
	if (failed)
		return 1;
	printf("OK: W walked again and consumed B's update\n");
	return 0;
}
