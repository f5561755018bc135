/* accept_flood: a connection flood for bench/accept_bench.py.
 *
 *   accept_flood HOST PORT SECONDS INFLIGHT [NSRC]
 *
 * Keeps INFLIGHT non-blocking connects in flight on one epoll instance (one
 * thread). Each connection: connect, wait for the server to close it (EOF),
 * close, start the next. With NSRC > 1 the connections are spread over the
 * source addresses 127.0.0.2 .. 127.0.0.(NSRC+1) (IP_BIND_ADDRESS_NO_PORT),
 * so that ports are reused less often (the server side keeps TIME_WAIT).
 * Prints one line of key=value pairs:
 *   completed  connections that saw EOF (the server accepted and closed)
 *   rate       completed per second
 *   refused reset timeout other   failed connections by cause
 *   inflight_end  connections still open at the end (stuck ones show here)
 *   max_ms     longest connect->EOF time of a completed connection
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef IP_BIND_ADDRESS_NO_PORT
#define IP_BIND_ADDRESS_NO_PORT 24
#endif

#define MAXFD 65536

static struct sockaddr_in dst;
static int nsrc = 1, ep, seq;
static double started[MAXFD];
static unsigned char connecting[MAXFD];
static long completed, refused, reset_, timeout_, other, inflight;
static double max_ms;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fail(int err)
{
	if (err == ECONNREFUSED)
		refused++;
	else if (err == ECONNRESET || err == EPIPE)
		reset_++;
	else if (err == ETIMEDOUT)
		timeout_++;
	else {
		if (other < 5)
			fprintf(stderr, "accept_flood: %s\n", strerror(err));
		other++;
	}
}

static int start(void)
{
	for (int tries = 0; tries < 100; tries++) {
		int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (s < 0) {
			perror("socket");
			return -1;
		}
		if (s >= MAXFD) {
			fprintf(stderr, "fd %d too large\n", s);
			exit(2);
		}
		if (nsrc > 1) {
			int one = 1;
			struct sockaddr_in src = {.sin_family = AF_INET};
			src.sin_addr.s_addr = htonl(0x7f000002 + (seq++ % nsrc));
			setsockopt(s, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
			if (bind(s, (struct sockaddr *)&src, sizeof src) < 0) {
				fail(errno);
				close(s);
				continue;
			}
		}
		int r = connect(s, (struct sockaddr *)&dst, sizeof dst);
		if (r < 0 && errno != EINPROGRESS) {
			fail(errno);
			close(s);
			continue;
		}
		struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
					 .data.fd = s};
		if (epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) < 0) {
			perror("epoll_ctl");
			exit(2);
		}
		started[s] = now();
		connecting[s] = 1;
		inflight++;
		return s;
	}
	return -1;
}

static void finish(int s, int err)
{
	if (err)
		fail(err);
	else {
		double ms = (now() - started[s]) * 1e3;
		if (ms > max_ms)
			max_ms = ms;
		completed++;
	}
	close(s);        /* also removes it from the epoll set */
	inflight--;
}

int main(int argc, char **argv)
{
	if (argc < 5) {
		fprintf(stderr, "usage: %s HOST PORT SECONDS INFLIGHT [NSRC]\n", argv[0]);
		return 2;
	}
	dst.sin_family = AF_INET;
	dst.sin_port = htons(atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1) {
		fprintf(stderr, "bad host %s\n", argv[1]);
		return 2;
	}
	double secs = atof(argv[3]);
	int want = atoi(argv[4]);
	if (argc > 5)
		nsrc = atoi(argv[5]);
	if (nsrc < 1)
		nsrc = 1;
	ep = epoll_create1(EPOLL_CLOEXEC);
	double t0 = now(), end = t0 + secs;
	for (int i = 0; i < want; i++)
		start();
	struct epoll_event evs[256];
	char buf[256];
	for (;;) {
		double t = now();
		if (t >= end)
			break;
		int n = epoll_wait(ep, evs, 256, (int)((end - t) * 1000) + 1);
		for (int i = 0; i < n; i++) {
			int s = evs[i].data.fd;
			uint32_t e = evs[i].events;
			if (connecting[s]) {
				int err = 0;
				socklen_t len = sizeof err;
				getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
				if (err) {
					connecting[s] = 0;
					finish(s, err);
					continue;
				}
				if (!(e & (EPOLLOUT | EPOLLIN | EPOLLRDHUP | EPOLLHUP)))
					continue;
				connecting[s] = 0;
			}
			if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
				for (;;) {
					ssize_t r = read(s, buf, sizeof buf);
					if (r > 0)
						continue;
					if (r == 0)
						finish(s, 0);
					else if (errno != EAGAIN && errno != EINTR)
						finish(s, errno);
					else if (errno == EINTR)
						continue;
					break;
				}
			}
		}
		while (inflight < want && start() >= 0)
			;
	}
	double el = now() - t0;
	printf("completed=%ld rate=%.1f refused=%ld reset=%ld timeout=%ld other=%ld "
	       "inflight_end=%ld max_ms=%.1f seconds=%.3f\n",
	       completed, completed / el, refused, reset_, timeout_, other, inflight, max_ms, el);
	return 0;
}
