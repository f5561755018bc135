/* echo_pingpong: a ping-pong client for bench/echo_bench.py.
 *
 *   echo_pingpong HOST PORT CONNS SECONDS MSGSIZE [WARMUP]
 *
 * Opens CONNS connections (TCP_NODELAY), then on one epoll instance (one
 * thread) each connection sends MSGSIZE bytes, waits until the same MSGSIZE
 * bytes came back (checked byte for byte), and sends the next message. The
 * first WARMUP seconds (default 1) are not counted; then SECONDS are.
 * Prints one line of key=value pairs:
 *   msgs rate     round trips completed in the window, and per second
 *   min_conn max_conn   fewest / most round trips of one connection
 *   mismatch      echoed bytes that differ from what was sent
 *   eof reset other   connections lost (server closed / reset / other error)
 *   stalled       connections with no reply in the last second of the run
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct conn {
	int fd;
	int got;                 /* bytes of the current reply received */
	unsigned char tag;       /* first byte of the current message */
	long count;              /* round trips counted in the window */
	double last;             /* time of the last completed round trip */
	int dead;
};

static int msgsize;
static long mismatch, eof_, reset_, other;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fill(unsigned char *buf, unsigned char tag)
{
	for (int i = 0; i < msgsize; i++)
		buf[i] = (unsigned char)(tag + i);
}

static void lose(struct conn *c, int err)
{
	if (c->dead)
		return;
	c->dead = 1;
	if (err == 0)
		eof_++;
	else if (err == ECONNRESET || err == EPIPE)
		reset_++;
	else {
		fprintf(stderr, "echo_pingpong: fd %d: %s\n", c->fd, strerror(err));
		other++;
	}
	close(c->fd);
}

static int send_msg(struct conn *c, unsigned char *buf)
{
	c->tag++;
	fill(buf, c->tag);
	ssize_t w = write(c->fd, buf, msgsize);
	if (w != msgsize) {
		/* 64 bytes into an empty socket buffer: a short write is a failure here */
		lose(c, w < 0 ? errno : EIO);
		return -1;
	}
	c->got = 0;
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: %s HOST PORT CONNS SECONDS MSGSIZE [WARMUP]\n", argv[0]);
		return 2;
	}
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1)
		return 2;
	int n = atoi(argv[3]);
	double secs = atof(argv[4]);
	msgsize = atoi(argv[5]);
	double warm = argc > 6 ? atof(argv[6]) : 1.0;
	if (n < 1 || msgsize < 1 || msgsize > 65536)
		return 2;
	struct conn *cs = calloc(n, sizeof *cs);
	unsigned char *out = malloc(msgsize), *in = malloc(65536), *want = malloc(msgsize);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	for (int i = 0; i < n; i++) {
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (s < 0 || connect(s, (struct sockaddr *)&dst, sizeof dst) < 0) {
			fprintf(stderr, "connect %d: %s\n", i, strerror(errno));
			return 1;
		}
		int one = 1;
		setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
		cs[i].fd = s;
		struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = i};
		epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
	}
	double t0 = now(), wend = t0 + warm, end = wend + secs;
	for (int i = 0; i < n; i++) {
		cs[i].last = t0;
		send_msg(&cs[i], out);
	}
	int counting = 0;
	double start = t0;
	struct epoll_event evs[512];
	for (;;) {
		double t = now();
		if (!counting && t >= wend) {
			counting = 1;
			start = t;
		}
		if (t >= end)
			break;
		int k = epoll_wait(ep, evs, 512, (int)(((counting ? end : wend) - t) * 1000) + 1);
		t = now();
		for (int j = 0; j < k; j++) {
			struct conn *c = &cs[evs[j].data.u32];
			if (c->dead)
				continue;
			ssize_t r = read(c->fd, in, 65536);
			if (r == 0) {
				lose(c, 0);
				continue;
			}
			if (r < 0) {
				if (errno != EAGAIN && errno != EINTR)
					lose(c, errno);
				continue;
			}
			if (c->got + r > msgsize) {
				mismatch += c->got + r - msgsize;   /* more than was sent */
				r = msgsize - c->got;
			}
			fill(want, c->tag);
			if (memcmp(in, want + c->got, r) != 0)
				mismatch++;
			c->got += r;
			if (c->got == msgsize) {
				if (counting && t < end)
					c->count++;
				c->last = t;
				send_msg(c, out);
			}
		}
	}
	double el = end - start;
	long msgs = 0, mn = -1, mx = 0, stalled = 0;
	double tend = now();
	for (int i = 0; i < n; i++) {
		msgs += cs[i].count;
		if (mn < 0 || cs[i].count < mn)
			mn = cs[i].count;
		if (cs[i].count > mx)
			mx = cs[i].count;
		if (!cs[i].dead && tend - cs[i].last > 1.0)
			stalled++;
	}
	printf("msgs=%ld rate=%.1f min_conn=%ld max_conn=%ld mismatch=%ld eof=%ld reset=%ld "
	       "other=%ld stalled=%ld seconds=%.3f\n",
	       msgs, msgs / el, mn, mx, mismatch, eof_, reset_, other, stalled, el);
	return 0;
}
