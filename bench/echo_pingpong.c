/* echo_pingpong: a ping-pong client for bench/echo_bench.py.
 *
 *   echo_pingpong HOST PORT CONNS SECONDS MSGSIZE [WARMUP [THREADS]]
 *
 * Opens CONNS connections (TCP_NODELAY), spread over THREADS threads
 * (default 1), each thread with its own epoll instance. Each connection
 * sends MSGSIZE bytes (1 B to 1 MiB; what the socket does not take at once
 * goes out on EPOLLOUT), waits until the same MSGSIZE bytes came back
 * (checked byte for byte), and sends the next message. The first WARMUP
 * seconds (default 1) are not counted; then SECONDS are.
 * Prints one line of key=value pairs:
 *   msgs rate     round trips completed in the window, and per second
 *   min_conn max_conn   fewest / most round trips of one connection
 *   mismatch      echoed bytes that differ from what was sent
 *   eof reset other   connections lost (server closed / reset / other error)
 *   stalled       connections with no reply in the last second of the run
 *   cpu           the client's CPU seconds (all threads) in the counted window
 *   seconds threads   the counted window's length; the threads used
 * cpu / seconds / threads near 1.0 means the client itself was the limit.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "closed_loop.h"

#define MAXMSG (1 << 20)
#define INBUF 65536

struct conn {
	int fd;
	int sent;                /* bytes of the current message written */
	int got;                 /* bytes of the current reply received */
	int want_out;            /* EPOLLOUT registered: the message is not all written */
	unsigned char tag;       /* message bytes are (tag + i) & 0xff */
	long count;              /* round trips counted in the window */
	double last;             /* time of the last completed round trip */
	int dead;
};

struct worker {
	pthread_t th;
	int ep;
	struct conn *cs;         /* this thread's connections */
	int n;
	long mismatch, eof_, reset_, other;
};

static int msgsize;
static double t_start, t_wend, t_end;
/* pattern[j] = j & 0xff: message "tag" is pattern + tag, so nothing is
 * filled per message and the check is one memcmp */
static unsigned char *pattern;

static void lose(struct worker *w, struct conn *c, int err)
{
	if (c->dead)
		return;
	c->dead = 1;
	if (err == 0)
		w->eof_++;
	else if (err == ECONNRESET || err == EPIPE)
		w->reset_++;
	else {
		fprintf(stderr, "echo_pingpong: fd %d: %s\n", c->fd, strerror(err));
		w->other++;
	}
	close(c->fd);
}

static void want_out(struct worker *w, struct conn *c, int on)
{
	if (c->want_out == on)
		return;
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | (on ? EPOLLOUT : 0),
				 .data.ptr = c};
	epoll_ctl(w->ep, EPOLL_CTL_MOD, c->fd, &ev);
	c->want_out = on;
}

/* writes what the socket takes of the current message; -1: lost */
static int push(struct worker *w, struct conn *c)
{
	while (c->sent < msgsize) {
		ssize_t r = write(c->fd, pattern + c->tag + c->sent, msgsize - c->sent);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			lose(w, c, errno);
			return -1;
		}
		c->sent += (int)r;
	}
	want_out(w, c, c->sent < msgsize);
	return 0;
}

static int next_msg(struct worker *w, struct conn *c)
{
	c->tag++;
	c->sent = c->got = 0;
	return push(w, c);
}

/* one event of a connection: the rest of the message out, the reply in */
static void on_event(void *arg, void *ptr, uint32_t events, double t)
{
	struct worker *w = arg;
	struct conn *c = ptr;
	static __thread unsigned char in[INBUF];
	if (c->dead)
		return;
	if ((events & EPOLLOUT) && push(w, c) < 0)
		return;
	if (!(events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)))
		return;
	ssize_t r = read(c->fd, in, INBUF);
	if (r == 0) {
		lose(w, c, 0);
		return;
	}
	if (r < 0) {
		if (errno != EAGAIN && errno != EINTR)
			lose(w, c, errno);
		return;
	}
	if (c->got + r > c->sent) {
		w->mismatch += c->got + r - c->sent;   /* more than was sent */
		r = c->sent - c->got;
	}
	if (memcmp(in, pattern + c->tag + c->got, r) != 0)
		w->mismatch++;
	c->got += (int)r;
	if (c->got == msgsize) {
		if (t >= t_wend && t < t_end)
			c->count++;
		c->last = t;
		next_msg(w, c);
	}
}

static void *run(void *arg)
{
	struct worker *w = arg;
	for (int i = 0; i < w->n; i++) {
		w->cs[i].last = t_start;
		next_msg(w, &w->cs[i]);
	}
	closed_loop_poll(w->ep, t_end, on_event, w);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: %s HOST PORT CONNS SECONDS MSGSIZE [WARMUP [THREADS]]\n",
			argv[0]);
		return 2;
	}
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
	if (inet_pton(AF_INET, argv[1], &dst.sin_addr) != 1)
		return 2;
	int n = atoi(argv[3]);
	double secs = atof(argv[4]);
	msgsize = atoi(argv[5]);
	double warm = argc > 6 ? atof(argv[6]) : 1.0;
	int nth = argc > 7 ? atoi(argv[7]) : 1;
	if (n < 1 || msgsize < 1 || msgsize > MAXMSG || nth < 1 || nth > 64 || nth > n) {
		fprintf(stderr, "echo_pingpong: bad CONNS, MSGSIZE (1..%d) or THREADS\n", MAXMSG);
		return 2;
	}
	pattern = malloc(MAXMSG + 512);
	for (int j = 0; j < MAXMSG + 512; j++)
		pattern[j] = (unsigned char)j;
	struct conn *cs = calloc(n, sizeof *cs);
	struct worker *ws = calloc(nth, sizeof *ws);
	/* thread i gets connections [i*n/nth, (i+1)*n/nth) */
	for (int i = 0; i < nth; i++) {
		ws[i].ep = epoll_create1(EPOLL_CLOEXEC);
		ws[i].cs = cs + (long)i * n / nth;
		ws[i].n = (int)((long)(i + 1) * n / nth - (long)i * n / nth);
	}
	for (int i = 0; i < nth; i++) {
		for (struct conn *c = ws[i].cs; c < ws[i].cs + ws[i].n; c++) {
			int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
			if (s < 0 || connect(s, (struct sockaddr *)&dst, sizeof dst) < 0) {
				fprintf(stderr, "connect %ld: %s\n", (long)(c - cs), strerror(errno));
				return 1;
			}
			int one = 1;
			setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
			fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK);
			c->fd = s;
			struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
			epoll_ctl(ws[i].ep, EPOLL_CTL_ADD, s, &ev);
		}
	}
	t_start = now();
	t_wend = t_start + warm;
	t_end = t_wend + secs;
	for (int i = 0; i < nth; i++)
		pthread_create(&ws[i].th, NULL, run, &ws[i]);
	sleep_until(t_wend);
	double cpu0 = cpu_now();
	sleep_until(t_end);
	double cpu1 = cpu_now();
	for (int i = 0; i < nth; i++)
		pthread_join(ws[i].th, NULL);
	long msgs = 0, mn = -1, mx = 0, stalled = 0, mismatch = 0, eof_ = 0, reset_ = 0, other = 0;
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
	for (int i = 0; i < nth; i++) {
		mismatch += ws[i].mismatch;
		eof_ += ws[i].eof_;
		reset_ += ws[i].reset_;
		other += ws[i].other;
	}
	printf("msgs=%ld rate=%.1f min_conn=%ld max_conn=%ld mismatch=%ld eof=%ld reset=%ld "
	       "other=%ld stalled=%ld cpu=%.3f seconds=%.3f threads=%d\n",
	       msgs, msgs / secs, mn, mx, mismatch, eof_, reset_, other, stalled, cpu1 - cpu0,
	       secs, nth);
	return 0;
}
