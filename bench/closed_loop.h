/* closed_loop.h: what the closed-loop load generators of bench/ share
 * (echo_pingpong.c for raw TCP, ws_echo_client.c for WebSockets): the
 * clocks, a sleep to a deadline, and one thread's epoll loop up to the end
 * of the run, handing each event to the client's own handler.
 * Header-only (static functions): each client is one .c file that
 * benchlib.build_c compiles alone. */
#ifndef BENCH_CLOSED_LOOP_H
#define BENCH_CLOSED_LOOP_H

#include <stdint.h>
#include <sys/epoll.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* the process's CPU seconds, every thread */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
	double d;
	while ((d = t - now()) > 0) {
		struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (time_t)d) * 1e9)};
		nanosleep(&ts, NULL);
	}
}

/* Waits on ep until t_end; on(arg, the event's data.ptr, its events, the
 * time it was seen) for every event. */
static void closed_loop_poll(int ep, double t_end, void (*on)(void *, void *, uint32_t, double),
			     void *arg)
{
	struct epoll_event evs[256];
	for (;;) {
		double t = now();
		if (t >= t_end)
			return;
		int k = epoll_wait(ep, evs, 256, (int)((t_end - t) * 1000) + 1);
		t = now();
		for (int j = 0; j < k; j++)
			on(arg, evs[j].data.ptr, evs[j].events, t);
	}
}

#endif
