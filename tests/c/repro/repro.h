/* Helpers of the tests/c/repro/ programs that drive pollers asleep: the
 * exit convention (0 "OK", 1 "FAIL: ...", 2 "SETUP: ...": not driven), a
 * monotonic clock, and whether a thread is blocked in epoll_wait as the
 * kernel shows it (/proc/self/task/N/syscall). Header-only: each repro is
 * its own program. */
#ifndef REPRO_H
#define REPRO_H

#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>

static inline void die(int code, const char *what)
{
	fprintf(stderr, "%s%s\n", code == 1 ? "FAIL: " : "SETUP: ", what);
	exit(code);
}

static inline double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Whether the thread of kernel id tid is blocked in epoll_wait / epoll_pwait. */
static inline int in_epoll_wait(int tid)
{
	char path[64], buf[64];
	long nr;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
	f = fopen(path, "r");
	if (!f)
		return 0;
	nr = fgets(buf, sizeof(buf), f) ? strtol(buf, NULL, 10) : -1;
	fclose(f);
	return nr == SYS_epoll_wait || nr == SYS_epoll_pwait;
}

#endif
