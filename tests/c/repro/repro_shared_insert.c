/* Deterministic reproduction of a finding of stress_shared -x 1 (issue 21):
 * a sibling's update pass that runs while fdc_insert_shared is still
 * registering the connection.
 *
 * fdc_insert_shared publishes the entry (fdc_insert), then registers it in
 * each poller of the mask, setting that poller's polled recv bit before
 * its ADD. fd.h says this happens "before anything else can name it", but
 * once published any thread may call a verb on the number (a stale handle,
 * or a handler of a sibling whose registration is already made and which
 * got the first bytes), and a verb that changes a direction puts the fd on
 * the group's update list for every owner. A sibling S passing then, before
 * the insert's ADD into S's instance, sees its polled bit (set first) with
 * nothing in the kernel: its DEL + ADD of the exclusive entry stops at the
 * DEL's ENOENT (poller_update.c: "our file is gone from this number"), clears S's
 * polled bits and reports the connection failed (FDC_ERR | FDC_POLL_CTL,
 * ENOENT) to its owner; then the insert's ADD succeeds, and the kernel has
 * a registration polled_mask does not show. A healthy connection closed
 * as failed, and a registration nobody will DEL before the close.
 *
 * Driven in one OS thread: epoll_ctl is wrapped at link time
 * (-Wl,--wrap=epoll_ctl), and the insert's ADD into S's instance first runs
 * the interleaving: V (a third thread of the group, not an owner) wants
 * send on the fd, and S's update pass runs; both contexts are idle, so
 * running them here is what their threads would do while the inserter is
 * preempted at that instruction. Then A's and S's passes converge.
 * Checks (what a correct core gives): no FDC_ERR / POLL_CTL on the fd, no
 * failed epoll_ctl, each instance registered iff its polled bits say so
 * (EPOLLOUT iff polled send), and S's poll reports no failure.
 * Exit status: 0 and "OK" if all hold, 1 with "FAIL: ..." lines if not, 2
 * if the interleaving could not be driven.
 *
 *   gcc -std=gnu11 -O1 -g -pthread -Wl,--wrap=epoll_ctl -I fdcore \
 *       fdcore/*.c \
 *       tests/c/repro/repro_shared_insert.c -o /tmp/repro_shared_insert
 * Run by tests/test_c_sanitizers.py as a strict xfail until fdcore changes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fd.h"

enum { A = 0, S = 1, V = 2 };

static struct fdc_table *g_t;
static int g_fd = -1, g_armed, g_driven, g_fails;

int __real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);

static int epfd_of(int tid)
{
	int tgid, ltid, epfd;

	fdc_thread_info(fdc_thread(g_t, tid), &tgid, &ltid, &epfd);
	return epfd;
}

int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	if (g_armed && op == EPOLL_CTL_ADD && fd == g_fd && epfd == epfd_of(S)) {
		g_armed = 0;
		if (fdc_want_send(fdc_thread(g_t, V), g_fd) != 0) {
			fprintf(stderr, "SETUP: want_send failed\n");
			exit(2);
		}
		fdc_update_pass(fdc_thread(g_t, S));
		g_driven = 1;
	}
	return __real_epoll_ctl(epfd, op, fd, ev);
}

static void fail(const char *what, long a, long b)
{
	printf("FAIL: %s (%ld, %ld)\n", what, a, b);
	g_fails++;
}

/* the kernel's events for g_fd in tid's instance | 1 << 32, 0 if not
 * registered */
static uint64_t kernel_events(int tid)
{
	char path[64], line[256];
	uint64_t got = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", epfd_of(tid));
	f = fopen(path, "r");
	if (!f)
		exit(2);
	while (fgets(line, sizeof(line), f)) {
		int tfd;
		unsigned ev;

		if (sscanf(line, "tfd: %d events: %x", &tfd, &ev) == 2 && tfd == g_fd)
			got = ev | 1ull << 32;
	}
	fclose(f);
	return got;
}

int main(void)
{
	struct fdc_fdinfo fi;
	struct fdc_counters c;
	struct fdc_event ev[8];
	int err, sv[2];

	g_t = fdc_table_new(1024, 3, 1, &err);
	if (!g_t || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return 2;
	g_fd = sv[0];
	g_armed = 1;
	if (fdc_insert_shared(fdc_thread(g_t, A), g_fd, 0x5EED, 1, 1u << A | 1u << S) != 0)
		return 2;
	if (!g_driven) {
		fprintf(stderr, "SETUP: the insert never added the fd to S's instance\n");
		return 2;
	}
	fdc_update_pass(fdc_thread(g_t, A));
	fdc_update_pass(fdc_thread(g_t, S));

	fdc_dump(g_t, g_fd, &fi);
	if (fi.state & (FDC_ERR | FDC_POLL_CTL))
		fail("a healthy connection marked failed (state, ctl_errno)", fi.state, fi.ctl_errno);
	for (int tid = A; tid <= S; tid++) {
		uint64_t bit = 1u << tid;
		uint64_t k = kernel_events(tid);
		int pr = !!(fi.polled_recv & bit), ps = !!(fi.polled_send & bit);

		if (!!k != (pr || ps))
			fail(tid == A ? "A: kernel registration vs polled bits (events, polled r)"
			              : "S: kernel registration vs polled bits (events, polled r)",
			     (long)k, pr);
		if (k && !!(k & EPOLLOUT) != ps)
			fail(tid == A ? "A: EPOLLOUT vs polled send" : "S: EPOLLOUT vs polled send",
			     (long)k, ps);
		fdc_counters(fdc_thread(g_t, tid), &c);
		if (c.ctl_err)
			fail(tid == A ? "A: failed epoll_ctl calls" : "S: failed epoll_ctl calls",
			     (long)c.ctl_err, 0);
	}
	int n = fdc_poll(fdc_thread(g_t, S), 0, ev, 8);
	for (int i = 0; i < n; i++) {
		if (ev[i].fd == g_fd && (ev[i].events & FDC_POLL_CTL))
			fail("S's poll reports the connection failed (events, errno)", ev[i].events,
			     fi.ctl_errno);
		fdc_leave(fdc_thread(g_t, S), ev[i].fd, ev[i].gen);
	}
	if (fdc_delete(fdc_thread(g_t, A), g_fd) != 1)
		return 2;
	close(sv[1]);
	fdc_table_free(g_t);
	if (g_fails)
		return 1;
	printf("OK: a sibling's pass during fdc_insert_shared leaves a consistent registration\n");
	return 0;
}
