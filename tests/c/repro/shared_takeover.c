/* Takeover of a group-shared connection (issue 21 review, fdc_takeover on
 * an FDC_EDGE fd).
 *
 * A shared connection is registered EPOLLIN | EPOLLEXCLUSIVE | EPOLLET in
 * each owner's poller (fdc_insert_shared). fdc_takeover narrows
 * thread_mask to the taker and leaves the old owners' registrations for
 * their pollers to drop "when they next see their bit gone", which is
 * right for a level-triggered fd: the report comes again. Here it does
 * not: the kernel offers an exclusive arrival to the first registered
 * instance with a sleeper and stops there, so an old owner asleep in its
 * poller swallows the arrival (fdc_enter: MIGRATED, its DEL programmed)
 * and, edge-triggered, the new owner never hears of those bytes.
 *
 * Three threads of one group: T0 inserts the connection for T0 and T1
 * (a subset: T2 is no owner, so its takeover is not the co-owner case
 * fdc_takeover refuses), T2 takes it over and wants to read it. All three
 * poll; once the kernel shows them asleep in epoll_wait, main writes one
 * byte: T2 must get the report. Passes when fdc_takeover refuses a shared
 * fd (nothing to take over: it is its group's already) or when the new
 * owner hears the arrival.
 * Exit status: 0 and "OK", 1 with "FAIL: ...", 2 if it could not be set up.
 * Built and run by tests/test_c_sanitizers.py.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fd.h"
#include "repro.h"

#define COOKIE 0x5EEDull

static struct fdc_table *g_t;
static int g_fd;
static _Atomic int g_tid[3];
static _Atomic int g_got[3];      /* reports for g_fd, by thread */
static _Atomic int g_quit;

static void *poller(void *arg)
{
	int me = (int)(intptr_t)arg;
	struct fdc_thread *th = fdc_thread(g_t, me);
	struct fdc_event ev[8];
	char b[64];

	atomic_store(&g_tid[me], (int)syscall(SYS_gettid));
	while (!atomic_load(&g_quit)) {
		int n = fdc_poll(th, 200, ev, 8);

		if (n < 0)
			die(2, "fdc_poll failed");
		for (int i = 0; i < n; i++) {
			if (ev[i].fd == g_fd) {
				atomic_fetch_add(&g_got[me], 1);
				while (read(g_fd, b, sizeof(b)) == (ssize_t)sizeof(b))
					;
			}
			fdc_leave(th, ev[i].fd, ev[i].gen);
		}
	}
	return NULL;
}

/* Whether thread `me` is blocked in epoll_wait / epoll_pwait. */
static int asleep(int me)
{
	return in_epoll_wait(atomic_load(&g_tid[me]));
}

int main(void)
{
	pthread_t th[3];
	int err, sv[2], rc;
	double t0;
	char msg[200];

	g_t = fdc_table_new(1024, 3, 1, &err);
	if (!g_t)
		die(2, "fdc_table_new");
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		die(2, "socketpair");
	g_fd = sv[0];
	if (fdc_insert_shared(fdc_thread(g_t, 0), g_fd, COOKIE, 1, 3) != 0)
		die(2, "fdc_insert_shared");
	rc = fdc_takeover(fdc_thread(g_t, 2), g_fd, COOKIE);
	if (rc == -EINVAL) {
		/* refused: the connection stays its owners', registrations intact */
		if (fdc_delete(fdc_thread(g_t, 0), g_fd) != 1)
			die(2, "fdc_delete deferred");
		close(sv[1]);
		fdc_table_free(g_t);
		printf("OK: the takeover of a group-shared connection is refused\n");
		return 0;
	}
	if (rc != 0) {
		snprintf(msg, sizeof(msg), "fdc_takeover: %d", rc);
		die(2, msg);
	}
	fdc_want_recv(fdc_thread(g_t, 2), g_fd);
	for (int i = 0; i < 3; i++)
		pthread_create(&th[i], NULL, poller, (void *)(intptr_t)i);
	t0 = now_s();
	/* every thread asleep, T2 past its update pass (its ADD made) */
	while (!atomic_load(&g_tid[0]) || !atomic_load(&g_tid[1]) || !atomic_load(&g_tid[2]) ||
	       !asleep(0) || !asleep(1) || !asleep(2)) {
		if (now_s() - t0 > 10)
			die(2, "the pollers never slept together");
		usleep(100);
	}
	if (write(sv[1], "x", 1) != 1)
		die(2, "write");
	t0 = now_s();
	while (!atomic_load(&g_got[2]) && now_s() - t0 < 2)
		usleep(1000);
	atomic_store(&g_quit, 1);
	for (int i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	snprintf(msg, sizeof(msg),
	         "the new owner T2 never heard of the arrival (reports to T0 %d, T1 %d, T2 %d)",
	         atomic_load(&g_got[0]), atomic_load(&g_got[1]), atomic_load(&g_got[2]));
	if (!atomic_load(&g_got[2]))
		die(1, msg);
	fdc_delete(fdc_thread(g_t, 2), g_fd);
	close(sv[1]);
	fdc_table_free(g_t);
	printf("OK: the new owner heard the arrival\n");
	return 0;
}
