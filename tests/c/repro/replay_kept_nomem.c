/* Deterministic reproduction of a review finding on fdcore's kept edges:
 * fdc_replay_kept's out-of-memory path (poller_owed.c) is retried inside the
 * very update pass that meets it, for ever.
 *
 * A verb that activates a direction of an FDC_EDGE fd takes its kept edge
 * and owes its caller the report (owe, a list grown by realloc). When the
 * list cannot grow, fdc_replay_kept puts the bits back on the state and
 * programs th's update pass, "whose take_kept tries again: never lost".
 * But take_kept itself runs in the update pass (update_fd), and on the
 * same failure programs the pass again: for an fd th owns alone the fd is
 * appended to the local list being walked (fdc_program_own_update), the
 * walk meets it again, fails again, appends again... until local_append's
 * "impossible: one entry per fd and pass" __builtin_trap kills the
 * process once the list holds maxfd entries. (With several owners the fd
 * goes back on the group's shared list, at the tail of the walk: the same
 * loop, without the trap.) A correct core leaves the retry to a later pass
 * and, once memory is back, hands out the replay.
 *
 * Driven in one OS thread: realloc is wrapped at link time
 * (-Wl,--wrap=realloc) and fails while g_nomem is set.
 * Steps: thread A inserts a socketpair end shared with itself alone (an
 * EDGE fd A owns alone); A's poll takes the ADD's writable report, kept
 * (KEPT_W); with realloc failing, A wants send (the replay cannot be
 * queued) and runs its update pass, in a forked child, since a trap kills
 * it; memory back, A's poll must report the fd writable.
 * Exit status: 0 and "OK" if all hold, 1 with "FAIL: ..." lines if not, 2
 * if the set-up failed.
 *
 *   gcc -std=gnu11 -O1 -g -pthread -Wl,--wrap=realloc -I fdcore \
 *       fdcore/*.c \
 *       tests/c/repro/replay_kept_nomem.c -o /tmp/replay_kept_nomem
 * Run by tests/test_c_sanitizers.py (a strict xfail until the retry was
 * deferred to the next pass: fdc_replay_kept, fdc_update_pass).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fd.h"
#include "nomem.h"

int main(void)
{
	struct fdc_table *t;
	struct fdc_thread *a;
	struct fdc_fdinfo fi;
	struct fdc_event ev[8];
	int err, sv[2], n, status, fails = 0, told = 0;
	pid_t pid;

	t = fdc_table_new(256, 2, 1, &err);
	if (!t || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return 2;
	a = fdc_thread(t, 0);
	if (fdc_insert_shared(a, sv[0], 0x5EED, 1, 1) != 0)
		return 2;
	n = fdc_poll(a, 0, ev, 8);                 /* the ADD's writable report */
	fdc_dump(t, sv[0], &fi);
	if (n != 0 || !(fi.state & FDC_KEPT_W) || !(fi.state & FDC_EDGE)) {
		fprintf(stderr, "SETUP: no kept writable edge (n %d, state %#x)\n", n, fi.state);
		return 2;
	}

	g_nomem = 1;
	if (fdc_want_send(a, sv[0]) != 0 || !g_failed) {
		fprintf(stderr, "SETUP: want_send did not try to queue the replay\n");
		return 2;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0) {
		alarm(20);                         /* the loop without a trap */
		fdc_update_pass(a);
		_exit(0);
	}
	if (waitpid(pid, &status, 0) != pid)
		return 2;
	if (!WIFEXITED(status) || WEXITSTATUS(status)) {
		printf("FAIL: the update pass with the replay unqueueable died (signal %d)\n",
		       WIFSIGNALED(status) ? WTERMSIG(status) : 0);
		fails++;
	}
	/* the child's pass proves nothing for the parent's state: run it here
	 * too only if it survived there */
	if (!fails)
		fdc_update_pass(a);
	g_nomem = 0;
	if (!fails) {
		n = fdc_poll(a, 0, ev, 8);
		for (int i = 0; i < n; i++) {
			if (ev[i].fd == sv[0] && (ev[i].events & FDC_POLL_OUT))
				told = 1;
			fdc_leave(a, ev[i].fd, ev[i].gen);
		}
		if (!told) {
			printf("FAIL: the kept writable edge never replayed once memory came back\n");
			fails++;
		}
	}
	fdc_delete(a, sv[0]);
	close(sv[1]);
	fdc_table_free(t);
	if (fails)
		return 1;
	printf("OK: a replay that cannot be queued is retried by a later pass, then told\n");
	return 0;
}
