/* Deterministic reproduction of a review finding on fdcore's kept edges
 * (left open: a strict xfail in tests/test_c_sanitizers.py): the
 * out-of-memory retry of fdc_replay_kept, deferred to a later pass for an
 * fd one thread owns (replay_kept_nomem.c), still piles up for an EDGE fd
 * shared by two threads while the other one sleeps.
 *
 * A and B share fd X (fdc_insert_shared, mask A|B); A holds a kept
 * writable edge and realloc fails. A's want_send cannot queue the replay:
 * the update bits A|B go up and X joins the group's shared list (B, asleep
 * in epoll_wait, is not woken: EDGE fds skip the wake). In each of A's
 * passes, walk_shared clears A's bit and leaves X listed (B's bit), take_kept
 * fails again and, in the pass, programs A's own update: X is appended to
 * A's local list. The next pass walks that copy (and appends another) and
 * meets X on the shared list again (appends a third): the bit check that
 * keeps one entry per fd and pass no longer holds, one copy more per pass,
 * A wakes itself each time (a spin), and once the local list holds maxfd
 * entries local_append's __builtin_trap kills the process (SIGILL).
 * A correct core keeps one retry per fd, whatever walk met it.
 *
 * Driven in one OS thread: realloc is wrapped at link time
 * (-Wl,--wrap=realloc) and fails while g_nomem is set; A's 400 passes run
 * in a forked child, since the trap kills it. Exit status: 0 and "OK" if
 * the passes end, 1 with "FAIL: ..." if A died, 2 if the set-up failed.
 *
 *   gcc -std=gnu11 -O -g -pthread -Wl,--wrap=realloc -I fdcore \
 *       fdcore/fd.c fdcore/updlist.c fdcore/poller.c \
 *       tests/c/repro/replay_kept_shared_nomem.c -o /tmp/replay_kept_shared_nomem
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include "fd-int.h"

static int g_nomem, g_failed;
void *__real_realloc(void *p, size_t n);
void *__wrap_realloc(void *p, size_t n)
{
	if (g_nomem) { g_failed++; return NULL; }
	return __real_realloc(p, n);
}

int main(void)
{
	struct fdc_table *t; struct fdc_thread *a; struct fdc_fdinfo fi;
	struct fdc_event ev[8]; int err, sv[2], n, status;
	t = fdc_table_new(256, 2, 1, &err);
	if (!t || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return 2;
	a = fdc_thread(t, 0);
	if (fdc_insert_shared(a, sv[0], 0x5EED, 1, 3) != 0)   /* A and B own it */
		return 2;
	n = fdc_poll(a, 0, ev, 8);
	fdc_dump(t, sv[0], &fi);
	if (n != 0 || !(fi.state & FDC_KEPT_W)) { fprintf(stderr, "SETUP n %d st %#x\n", n, fi.state); return 2; }
	g_nomem = 1;
	fdc_want_send(a, sv[0]);     /* replay fails: shared list, bits A|B */
	pid_t pid = fork();
	if (pid == 0) {
		alarm(20);
		for (int p = 0; p < 400; p++) {
			fdc_update_pass(a);
			if (p < 5 || p % 50 == 0)
				printf("pass %d: A's local list holds %d entries\n", p, a->nbupdt), fflush(stdout);
		}
		_exit(0);
	}
	waitpid(pid, &status, 0);
	g_nomem = 0;
	fdc_delete(a, sv[0]);
	close(sv[1]);
	fdc_table_free(t);
	if (WIFSIGNALED(status)) {
		printf("FAIL: A died (signal %d) after its local list filled with copies of one fd\n",
		       WTERMSIG(status));
		return 1;
	}
	printf("OK: one retry per fd while memory is short\n");
	return 0;
}
