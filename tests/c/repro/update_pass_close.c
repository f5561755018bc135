/* Deterministic reproduction of a defect found while fixing the kept-edge
 * out-of-memory retry (issue 21, review of fd3c058): the local list's
 * accounting of an update pass does not survive a close made during it.
 *
 * fdc_update_pass walks the nb entries th's local list held when it began,
 * then drops them with `th->nbupdt -= nb`. A final close made by th's own
 * thread (close_orphan) trims its fd off the tail of that same list ("update
 * then close is common": nbupdt--). If the close happens during the walk
 * (here: a hook at FDC_HK_UPDATE_CONSUMED deletes another fd th owns alone,
 * whose entry is the list's last) and the trimmed entry is one the walk
 * counted in nb, the pass ends with nbupdt == -1: the memmove that follows
 * is asked for (size_t)-1 entries (ASAN: negative-size-param, else a
 * crash), and a list with a negative length corrupts every later append.
 * A correct core ends the pass with an empty list whatever closed during it.
 *
 * Driven in one OS thread; the pass runs in a forked child, since the bug
 * kills it (a child's exit 3: it printed its FAIL line). Exit status: 0 and "OK" if the pass ends with an empty list,
 * 1 with "FAIL: ..." if not, 2 if the set-up failed.
 *
 *   gcc -std=gnu11 -O1 -g -pthread -I fdcore \
 *       fdcore/*.c \
 *       tests/c/repro/update_pass_close.c -o /tmp/update_pass_close
 * Run by tests/test_c_sanitizers.py under TSAN and ASAN.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fd.h"

static struct fdc_thread *g_a;
static int g_x, g_y, g_deleted;

/* during A's pass, once X's update is consumed: delete Y, whose entry is
 * the last of A's local list (its final close runs here, on A's context) */
static void hook(void *arg, int point, int tid, int fd, uint32_t gen)
{
	(void)arg;
	(void)gen;
	if (point == FDC_HK_UPDATE_CONSUMED && tid == 0 && fd == g_x && !g_deleted) {
		g_deleted = 1;
		fdc_delete(g_a, g_y);
	}
}

int main(void)
{
	struct fdc_table *t;
	int err, sx[2], sy[2], status;
	pid_t pid;

	t = fdc_table_new(256, 1, 1, &err);
	if (!t || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sx) < 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sy) < 0)
		return 2;
	g_a = fdc_thread(t, 0);
	g_x = sx[0];
	g_y = sy[0];
	if (fdc_insert(t, g_x, 0x1, 1, 1, 1, 0) != 0 || fdc_insert(t, g_y, 0x2, 1, 1, 1, 0) != 0)
		return 2;
	/* both owned by A alone: A's local list is [X, Y] */
	if (fdc_want_recv(g_a, g_x) != 0 || fdc_want_recv(g_a, g_y) != 0 || g_a->nbupdt != 2) {
		fprintf(stderr, "SETUP: local list holds %d entries, expected 2\n", g_a->nbupdt);
		return 2;
	}
	fdc_set_hook(t, hook, NULL);
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0) {
		alarm(20);
		fdc_update_pass(g_a);
		if (!g_deleted)
			_exit(2);
		if (g_a->nbupdt != 0) {
			printf("FAIL: the pass that closed Y ended with %d local entries, not 0\n",
			       g_a->nbupdt);
			fflush(stdout);
			_exit(3);
		}
		_exit(0);
	}
	if (waitpid(pid, &status, 0) != pid)
		return 2;
	fdc_set_hook(t, NULL, NULL);
	fdc_delete(g_a, g_y);
	fdc_delete(g_a, g_x);
	close(sx[1]);
	close(sy[1]);
	fdc_table_free(t);
	if (WIFEXITED(status) && WEXITSTATUS(status) == 2)
		return 2;
	if (WIFSIGNALED(status)) {
		printf("FAIL: the pass that closed Y died (signal %d)\n", WTERMSIG(status));
		return 1;
	}
	if (WEXITSTATUS(status) == 3)   /* its FAIL line is printed */
		return 1;
	if (WEXITSTATUS(status)) {
		/* a sanitizer's report, with its exit code */
		printf("FAIL: the pass that closed Y died (exit %d)\n", WEXITSTATUS(status));
		return 1;
	}
	printf("OK: a close during the update pass leaves the local list consistent\n");
	return 0;
}
