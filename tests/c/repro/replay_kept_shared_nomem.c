/* Deterministic reproduction of a review finding on fdcore's kept edges
 * (the review of fd3c058): the out-of-memory retry of fdc_replay_kept,
 * deferred to a later pass for an fd one thread owns (replay_kept_nomem.c),
 * still piled up for an EDGE fd shared by two threads while the other one
 * sleeps.
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
 * A correct core keeps one retry per fd, whatever walk met it, and retries
 * it with a back-off instead of a wake-up of its own: A is never woken,
 * a poll with a 300 ms timeout lasts its 300 ms and retries a few times
 * in them (not once: a timer; not hundreds: a spin), and once memory is
 * back, a poll with a long timeout replays the kept edge (POLL_OUT)
 * within a back-off, instead of sleeping its whole timeout through it.
 *
 * Driven in one OS thread: realloc is wrapped at link time
 * (-Wl,--wrap=realloc) and fails while g_nomem is set (or g_fail_left
 * is positive); A's 400 passes run in a forked child, since the trap
 * kills it. Exit status: 0 and "OK" if all hold, 1 with "FAIL: ..." if
 * not, 2 if the set-up failed.
 *
 *   gcc -std=gnu11 -O -g -pthread -Wl,--wrap=realloc -I fdcore \
 *       fdcore/*.c \
 *       tests/c/repro/replay_kept_shared_nomem.c -o /tmp/replay_kept_shared_nomem
 * Run by tests/test_c_sanitizers.py (a strict xfail until the retry got a
 * ring of its own: poller_owed.c, retry_later, and poller_update.c, retry_owed).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "fd-int.h"
#include "nomem.h"
#include "repro.h"

/* the child: A's passes while memory is short; exit 0 if A's lists held
 * one entry at most for X and A never woke itself, 1 otherwise */
static int passes(struct fdc_thread *a)
{
	uint64_t v;
	int most = 0;

	alarm(20);
	for (int p = 0; p < 400; p++) {
		fdc_update_pass(a);
		if (a->nbupdt > most)
			most = a->nbupdt;
	}
	if (most > 1) {
		printf("FAIL: A's local list held up to %d entries for one fd\n", most);
		return 1;
	}
	if (read(a->evfd, &v, sizeof(v)) == sizeof(v)) {
		printf("FAIL: A woke itself (%llu wake-ups) while memory was short\n",
		       (unsigned long long)v);
		return 1;
	}
	return 0;
}

int main(void)
{
	struct fdc_table *t; struct fdc_thread *a; struct fdc_fdinfo fi;
	struct fdc_event ev[8]; int err, sv[2], n, status, fails = 0, told = 0, tries;
	long long t0, took;

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
	if (!g_failed) { fprintf(stderr, "SETUP: want_send did not try to queue the replay\n"); return 2; }
	fflush(stdout);
	pid_t pid = fork();
	if (pid < 0)
		return 2;
	if (pid == 0) {
		n = passes(a);
		fflush(stdout);
		_exit(n);
	}
	waitpid(pid, &status, 0);
	if (WIFSIGNALED(status)) {
		printf("FAIL: A died (signal %d) after its local list filled with copies of one fd\n",
		       WTERMSIG(status));
		fails++;
	}
	else if (WEXITSTATUS(status))
		fails++;

	/* here (the parent's A never passed yet): memory still short, a poll
	 * waits its whole timeout, retrying at growing intervals meanwhile */
	if (!fails) {
		tries = g_failed;
		t0 = (long long)(now_s() * 1000);
		n = fdc_poll(a, 300, ev, 8);
		took = (long long)(now_s() * 1000) - t0;
		tries = g_failed - tries;
		if (n != 0 || took < 280 || tries < 3 || tries > 20) {
			printf("FAIL: a 300 ms poll while memory is short returned %d after %lld ms, "
			       "%d retries (want 0, the whole 300 ms, 3..20 retries)\n", n, took, tries);
			fails++;
		}
	}
	/* memory back after one more failure: the retry that comes next, a
	 * back-off later, replays the edge long before the poll's timeout */
	g_nomem = 0;
	g_fail_left = 1;
	if (!fails) {
		t0 = (long long)(now_s() * 1000);
		n = fdc_poll(a, 3000, ev, 8);
		took = (long long)(now_s() * 1000) - t0;
		for (int i = 0; i < n; i++) {
			if (ev[i].fd == sv[0] && (ev[i].events & FDC_POLL_OUT))
				told = 1;
			fdc_leave(a, ev[i].fd, ev[i].gen);
		}
		if (!told || took > 1000) {
			printf("FAIL: the kept writable edge %s (poll returned %d after %lld ms)\n",
			       told ? "replayed late" : "never replayed once memory came back", n, took);
			fails++;
		}
	}
	g_fail_left = 0;
	fdc_delete(a, sv[0]);
	close(sv[1]);
	fdc_table_free(t);
	if (fails)
		return 1;
	printf("OK: one retry per fd while memory is short, with a back-off, told once it is back\n");
	return 0;
}
