/* Affinity of a group-shared connection (fdc_insert_shared, issue 21): with
 * the inserting thread and a sibling both asleep in their pollers, an
 * arrival is reported to the inserting thread and to nobody else (its
 * registration comes first in the file's wait queue, and EPOLLEXCLUSIVE
 * stops the kernel's walk at the first instance with a sleeper).
 *
 * Two threads of one group, T0 and T1. For each inserter (T1 then T0, so
 * an order "lowest thread id first" is caught as well as "siblings
 * first"), ROUNDS rounds: both threads enter fdc_poll with a timeout; once
 * the kernel shows both asleep in epoll_wait (/proc/self/task/N/syscall),
 * main writes one byte on the peer; the inserter must return with it, the
 * sibling must time out empty. The handler reads until a short read.
 * Before rounds 1 and on, the inserter changes directions as a large
 * response does (want_send, stop_recv, stop_send, want_recv, its poller
 * running its update pass and reports in between): the connection must
 * keep its thread (fdcore registers a shared connection once, and never
 * DEL + ADDs it for a direction change, which would put the inserter's
 * instance behind its sibling's for good).
 * Exit status: 0 and "OK" if every round went to the inserter, 1 with
 * "FAIL: ..." otherwise, 2 if a round could not be set up.
 *
 * Its own program (not part of the stress binary); built and run by
 * tests/test_c_sanitizers.py (must pass) and tests/test_c_mutations.py
 * (siblings registered first: must fail in round 0; re-registered on a
 * direction change: must fail in round 1). tests/fdcore/
 * test_fd_shared_conn.py checks the same through the Python binding.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
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

#define ROUNDS 3
#define SIBLING_WAIT_MS 300

static struct fdc_table *g_t;
static int g_fd;
static sem_t g_go[2], g_done[2];
static _Atomic int g_tid[2];
static _Atomic int g_got[2];      /* reports for g_fd in this round */
static _Atomic int g_quit;
static _Atomic int g_ins;          /* the inserting thread of this round */

static void *poller(void *arg)
{
	int me = (int)(intptr_t)arg;
	struct fdc_thread *th = fdc_thread(g_t, me);
	struct fdc_event ev[8];
	char b[64];

	atomic_store(&g_tid[me], (int)syscall(SYS_gettid));
	for (;;) {
		sem_wait(&g_go[me]);
		if (atomic_load(&g_quit))
			return NULL;
		/* the inserter waits long (the byte comes), the sibling not */
		int n = fdc_poll(th, me == atomic_load(&g_ins) ? 3000 : SIBLING_WAIT_MS, ev, 8);
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
		sem_post(&g_done[me]);
	}
}

/* Whether thread `me` is blocked in epoll_wait / epoll_pwait. */
static int asleep(int me)
{
	return in_epoll_wait(atomic_load(&g_tid[me]));
}

/* th's poller runs its update pass and takes its reports (none is for a
 * thread waiting: both pollers are parked on their semaphores). */
static void turn(struct fdc_thread *th)
{
	struct fdc_event ev[8];
	int n = fdc_poll(th, 0, ev, 8);

	if (n < 0)
		die(2, "fdc_poll failed");
	for (int i = 0; i < n; i++)
		fdc_leave(th, ev[i].fd, ev[i].gen);
}

/* The direction changes of a response that did not fit in one write, by
 * the inserter (main uses its context while its poller thread waits on
 * its semaphore: one OS thread at a time). */
static void change_directions(struct fdc_thread *th, int fd)
{
	int (*const verbs[])(struct fdc_thread *, int) = {
		fdc_want_send, fdc_stop_recv, fdc_stop_send, fdc_want_recv,
	};

	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++) {
		if (verbs[i](th, fd) != 0)
			die(2, "direction verb failed");
		turn(th);
	}
}

int main(void)
{
	pthread_t th[2];
	int err, sv[2];

	g_t = fdc_table_new(1024, 2, 1, &err);
	if (!g_t)
		die(2, "fdc_table_new");
	for (int i = 0; i < 2; i++) {
		sem_init(&g_go[i], 0, 0);
		sem_init(&g_done[i], 0, 0);
		pthread_create(&th[i], NULL, poller, (void *)(intptr_t)i);
	}
	while (!atomic_load(&g_tid[0]) || !atomic_load(&g_tid[1]))
		sched_yield();
	for (int ins = 1; ins >= 0; ins--) {
		int sib = !ins;
		char msg[160];

		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
			die(2, "socketpair");
		g_fd = sv[0];
		atomic_store(&g_ins, ins);
		if (fdc_insert_shared(fdc_thread(g_t, ins), g_fd, 0x5EED, 1, 3) != 0)
			die(2, "fdc_insert_shared");
		for (int r = 0; r < ROUNDS; r++) {
			double t0 = now_s();

			if (r)
				change_directions(fdc_thread(g_t, ins), g_fd);
			atomic_store(&g_got[0], 0);
			atomic_store(&g_got[1], 0);
			sem_post(&g_go[0]);
			sem_post(&g_go[1]);
			while (!asleep(0) || !asleep(1)) {
				if (now_s() - t0 > 10)
					die(2, "the pollers never slept together");
				usleep(100);
			}
			if (write(sv[1], "x", 1) != 1)
				die(2, "write");
			sem_wait(&g_done[ins]);
			sem_wait(&g_done[sib]);
			snprintf(msg, sizeof(msg),
			         "inserter T%d round %d: reports to the inserter %d, to the sibling %d"
			         " (want 1 and 0)", ins, r, atomic_load(&g_got[ins]),
			         atomic_load(&g_got[sib]));
			if (atomic_load(&g_got[ins]) != 1 || atomic_load(&g_got[sib]) != 0)
				die(1, msg);
		}
		/* nobody polls: the delete closes at once */
		if (fdc_delete(fdc_thread(g_t, ins), g_fd) != 1)
			die(2, "fdc_delete deferred");
		close(sv[1]);
	}
	atomic_store(&g_quit, 1);
	for (int i = 0; i < 2; i++) {
		sem_post(&g_go[i]);
		pthread_join(th[i], NULL);
	}
	fdc_table_free(g_t);
	printf("OK: %d rounds each way, every arrival to the inserting thread alone\n", ROUNDS);
	return 0;
}
