/* Deterministic reproduction of a finding of the adversarial review of
 * fdc_requeue and the retry ring (fdstress, 2026-11-26): a listener whose
 * registration failed was never polled again by that thread.
 *
 * fdc_requeue moves a thread's registration of an exclusive listener to
 * the end of the file's wait queue with a DEL and an ADD after each accept
 * batch (worker/loop.py, _requeue). The ADD can fail after the DEL
 * succeeded: ENOSPC once max_user_watches is reached (a connection flood
 * under dispatch costs one watch per connection and loop thread), ENOMEM.
 * fdcore then clears the thread's polled bit and reports FDC_POLL_CTL to
 * the owner (I8); but the owner of a listener (the worker's loop) has
 * nothing to close and nothing to re-register with (a stop_recv/want_recv
 * pair would make every thread of the group DEL and ADD it): it accepts on
 * the report and goes on. The thread never polled the listener again, and
 * a worker of one loop thread (-w 1 -t 1) accepted no connection for the
 * rest of its life, though alive and answering its master. The same after
 * the want_recv that resumes accepting after EMFILE (its ADD, made under
 * the same resource shortage). A correct core re-makes a failed
 * registration of an exclusive fd that is not a group-shared connection
 * (a listener) by its thread's later update passes, with the retry ring's
 * back-off, reporting each failure as before.
 *
 * Driven in one OS thread, epoll_ctl wrapped at link time
 * (-Wl,--wrap=epoll_ctl): T polls an exclusive loopback listener; a
 * client connects; T accepts, and its requeue's ADD fails once (ENOSPC);
 * T's next poll reports the failure (ERR | CTL); a second client connects:
 * T's poll must report the listener readable within a second, and accept
 * it. Exit status: 0 and "OK" if so, 1 with "FAIL: ..." if not, 2 if the
 * set-up failed.
 *
 *   gcc -std=gnu11 -O1 -g -pthread -Wl,--wrap=epoll_ctl -I fdcore \
 *       fdcore/*.c \
 *       tests/c/repro/listener_requeue_fail.c -o /tmp/listener_requeue_fail
 * Run by tests/test_c_sanitizers.py under TSAN and ASAN.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fd.h"
#include "repro.h"

static int g_fail_fd = -1, g_fail_adds, g_failed;

int __real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);

/* the next g_fail_adds ADDs of the listener fail as at max_user_watches */
int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	if (fd == g_fail_fd && op == EPOLL_CTL_ADD && g_fail_adds > 0) {
		g_fail_adds--;
		g_failed++;
		errno = ENOSPC;
		return -1;
	}
	return __real_epoll_ctl(epfd, op, fd, ev);
}

static int client(const struct sockaddr_in *sa)
{
	int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (c < 0 || connect(c, (const struct sockaddr *)sa, sizeof(*sa)) < 0)
		die(2, "client connect");
	return c;
}

/* Polls up to ms for a report of fd with all of `want`; leaves every
 * report. Returns the events of fd's report, or 0. */
static uint32_t poll_for(struct fdc_thread *th, int fd, uint32_t want, int ms)
{
	struct fdc_event ev[8];
	double until = now_s() + ms / 1000.0;
	uint32_t got = 0;

	while (!got && now_s() < until) {
		int n = fdc_poll(th, (int)((until - now_s()) * 1000) + 1, ev, 8);

		if (n < 0)
			die(2, "fdc_poll");
		for (int i = 0; i < n; i++) {
			if (ev[i].fd == fd && (ev[i].events & want) == want)
				got = ev[i].events;
			fdc_leave(th, ev[i].fd, ev[i].gen);
		}
	}
	return got;
}

int main(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	socklen_t sl = sizeof(sa);
	struct fdc_table *t;
	struct fdc_thread *th;
	struct fdc_event ev[8];
	int err, lfd, one = 1, c1, c2, conn, n, rq = 0, held = 0, ok = 0;
	uint32_t got;

	t = fdc_table_new(256, 1, 1, &err);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (!t || lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 16) < 0 ||
	    getsockname(lfd, (struct sockaddr *)&sa, &sl) < 0)
		die(2, "listener");
	th = fdc_thread(t, 0);
	if (fdc_insert(t, lfd, 0x11, 2, 1, 1, FDC_EXCLUSIVE | FDC_SOLE) != 0 ||
	    fdc_want_recv(th, lfd) != 0)
		die(2, "insert");
	c1 = client(&sa);
	n = fdc_poll(th, 2000, ev, 8);
	for (int i = 0; i < n; i++) {
		if (ev[i].fd == lfd && (ev[i].events & FDC_POLL_IN)) {
			held = 1;
			if (fdc_accept(th, lfd, &conn, 1) != 1)
				die(2, "accept of the first client");
			close(conn);
			/* the worker's requeue after its accept batch: its ADD fails */
			g_fail_fd = lfd;
			g_fail_adds = 1;
			rq = fdc_requeue(th, lfd);
		}
		fdc_leave(th, ev[i].fd, ev[i].gen);
	}
	if (!held || rq != -ENOSPC || g_failed != 1) {
		fprintf(stderr, "SETUP: listener reported %d, requeue %d, failed ADDs %d\n", held, rq,
		        g_failed);
		return 2;
	}
	/* the owner is told (I8) */
	if (!(poll_for(th, lfd, FDC_POLL_ERR | FDC_POLL_CTL, 1000)))
		die(1, "the failed requeue was not reported (FDC_POLL_CTL)");
	/* resources back: the next connection must be heard of and taken */
	c2 = client(&sa);
	got = poll_for(th, lfd, FDC_POLL_IN, 1000);
	if (!got)
		printf("FAIL: after its failed requeue, the listener was never polled again by its"
		       " thread: a connection waited 1 s unannounced\n");
	else if (fdc_accept(th, lfd, &conn, 1) != 1)
		printf("FAIL: the listener reported %#x but nothing could be accepted\n", got);
	else {
		close(conn);
		ok = 1;
		printf("OK: a listener whose requeue failed is polled again by its thread\n");
	}
	close(c1);
	close(c2);
	fdc_delete(th, lfd);
	fdc_table_free(t);
	return ok ? 0 : 1;
}
