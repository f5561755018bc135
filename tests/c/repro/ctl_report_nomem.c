/* Deterministic reproduction of a finding of the adversarial look at
 * fdcore's out-of-memory paths (issue 21, after the review of fd3c058):
 * the report of a failed registration was lost when memory was short.
 *
 * An update pass whose epoll_ctl fails (ENOSPC at max_user_watches,
 * ENOMEM) records FDC_ERR | FDC_POLL_CTL on the fd and queues its report
 * to the owner (fail_fd: owe(), a list grown by realloc). When that list
 * could not grow, the report was dropped ("only the report is lost"): the
 * owner of a connection that nobody polls any more was never told, and
 * waited for events that never came (I8: a failed registration is
 * reported, never swallowed). A correct core retries the report in a
 * later pass, waiting no longer than a back-off meanwhile, and tells the
 * owner once memory is back.
 *
 * Driven in one OS thread: epoll_ctl and realloc are wrapped at link time
 * (-Wl,--wrap=epoll_ctl,--wrap=realloc). A owns X alone and wants to read
 * it; its pass's ADD fails with ENOSPC while realloc fails; then realloc
 * fails once more and works again: a poll with a 3 s timeout must report X
 * with ERR | CTL well before its timeout.
 * Exit status: 0 and "OK" if so, 1 with "FAIL: ..." if not, 2 if the
 * set-up failed.
 *
 *   gcc -std=gnu11 -O1 -g -pthread -Wl,--wrap=epoll_ctl,--wrap=realloc \
 *       -I fdcore fdcore/*.c \
 *       tests/c/repro/ctl_report_nomem.c -o /tmp/ctl_report_nomem
 * Run by tests/test_c_sanitizers.py under TSAN and ASAN.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fd.h"
#include "nomem.h"
#include "repro.h"

static int g_ctl_fd = -1;

int __real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);

/* the ADD of X fails as at max_user_watches */
int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	if (fd == g_ctl_fd && op == EPOLL_CTL_ADD) {
		errno = ENOSPC;
		return -1;
	}
	return __real_epoll_ctl(epfd, op, fd, ev);
}

int main(void)
{
	struct fdc_table *t;
	struct fdc_thread *a;
	struct fdc_fdinfo fi;
	struct fdc_event ev[8];
	int err, sv[2], n, told = 0, fails = 0;
	long long t0, took;

	t = fdc_table_new(256, 1, 1, &err);
	if (!t || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return 2;
	a = fdc_thread(t, 0);
	if (fdc_insert(t, sv[0], 0x5EED, 1, 1, 1, 0) != 0 || fdc_want_recv(a, sv[0]) != 0)
		return 2;
	g_ctl_fd = sv[0];
	g_nomem = 1;
	n = fdc_poll(a, 0, ev, 8);         /* the ADD fails; its report cannot be queued */
	fdc_dump(t, sv[0], &fi);
	if (n != 0 || !(fi.state & FDC_POLL_CTL) || fi.ctl_errno != ENOSPC || !g_failed) {
		fprintf(stderr, "SETUP: n %d state %#x errno %d realloc failures %d\n",
		        n, fi.state, fi.ctl_errno, g_failed);
		return 2;
	}
	/* memory back after one more failure */
	g_nomem = 0;
	g_fail_left = 1;
	t0 = (long long)(now_s() * 1000);
	n = fdc_poll(a, 3000, ev, 8);
	took = (long long)(now_s() * 1000) - t0;
	for (int i = 0; i < n; i++) {
		if (ev[i].fd == sv[0] && (ev[i].events & FDC_POLL_CTL) && (ev[i].events & FDC_POLL_ERR))
			told = 1;
		fdc_leave(a, ev[i].fd, ev[i].gen);
	}
	if (!told || took > 1000) {
		printf("FAIL: the failed registration's report %s (poll returned %d after %lld ms)\n",
		       told ? "came late" : "was lost for want of memory", n, took);
		fails++;
	}
	g_ctl_fd = -1;
	fdc_delete(a, sv[0]);
	close(sv[1]);
	fdc_table_free(t);
	if (fails)
		return 1;
	printf("OK: a failed registration is reported once memory is back\n");
	return 0;
}
