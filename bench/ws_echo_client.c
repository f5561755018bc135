/* ws_echo_client: the WebSocket load generator of bench/ws_echo.py (issue 23).
 *
 *   ws_echo_client HOST PORT CONNS SECONDS MSGSIZE WARMUP THREADS OPCODE [DEFLATE]
 *
 * Opens CONNS WebSockets (TCP_NODELAY; the upgrade done blocking, one by
 * one, before anything is timed), spread over THREADS threads, each with
 * its own epoll instance. Each connection sends one masked message of
 * MSGSIZE bytes (OPCODE 1: text, ASCII; 2: binary; MSGSIZE < 65536, a
 * 16-bit length), waits for the server's echo (one unmasked frame, its
 * payload compared byte for byte) and sends the next: a closed loop, like
 * bench/echo_pingpong.c for raw TCP. The first WARMUP seconds are not
 * counted; then SECONDS are. A server ping is skipped (not answered: runs
 * are shorter than any peer's ping timeout); a close frame or EOF loses
 * the connection.
 *
 * DEFLATE 1: permessage-deflate (RFC 7692) offered as a browser offers it,
 * with client_no_context_takeover: every message is sent compressed (RSV1;
 * compressed once, each message its own stream, as that parameter lets
 * the client do), the server's compressed echoes (RSV1) inflated with
 * each connection's own inflater (the server's context kept between
 * messages, unless it answers server_no_context_takeover) and compared
 * as plain ones are. A server that does not take the offer fails the run
 * (exit 3, "deflate not negotiated"): bench/ws_echo.py then has no row
 * for it.
 *
 * Prints one line of key=value pairs:
 *   msgs rate          echoes completed in the window, and per second
 *   min_conn max_conn  fewest / most echoes of one connection
 *   mismatch           echoes whose frame or payload differ from what was sent
 *   lost               connections lost (EOF, reset, close frame, error)
 *   stalled            connections with no echo in the window's last second
 *   cpu                the client's CPU seconds (all threads) in the window
 *   seconds threads    the window's length; the threads used
 * cpu / seconds / threads near 1.0 means the client itself was the limit;
 * bench/ws_echo.py prints that share beside each row.
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

#include <zlib.h>

#include "closed_loop.h"

#define INBUF (1 << 17)

struct conn {
	int fd;
	size_t sent;             /* bytes of the current frame written */
	size_t have;             /* bytes waiting in in[] */
	int want_out;            /* EPOLLOUT registered: the frame is not all written */
	long count;              /* echoes counted in the window */
	double last;             /* time of the last echo */
	int dead;
	z_stream *z;             /* DEFLATE: the server's messages' inflater */
	unsigned char in[INBUF];
};

struct worker {
	pthread_t th;
	int ep;
	struct conn **cs;
	int n;
	long mismatch, lost;
};

static size_t msgsize, framelen;
static int opcode, deflate_on, server_reset;
static __thread unsigned char *scratch;   /* DEFLATE: an echo inflated, per thread */
static double t_start, t_wend, t_end;
static unsigned char *payload;   /* what every message carries */
static unsigned char *outframe;  /* the client frame carrying it, masked once */

static void lose(struct worker *w, struct conn *c)
{
	if (c->dead)
		return;
	c->dead = 1;
	w->lost++;
	close(c->fd);
}

static void want_out(struct worker *w, struct conn *c, int on)
{
	if (c->want_out == on)
		return;
	struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = c};
	epoll_ctl(w->ep, EPOLL_CTL_MOD, c->fd, &ev);
	c->want_out = on;
}

/* writes what the socket takes of the current frame; -1: lost */
static int push(struct worker *w, struct conn *c)
{
	while (c->sent < framelen) {
		ssize_t r = write(c->fd, outframe + c->sent, framelen - c->sent);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				break;
			lose(w, c);
			return -1;
		}
		c->sent += (size_t)r;
	}
	want_out(w, c, c->sent < framelen);
	return 0;
}

/* A compressed echo's payload inflated into this thread's scratch (7.2.2:
 * the sync flush's tail put back): its length, or (size_t)-1 if it does
 * not inflate or is longer than a message of ours. */
static size_t inflate_echo(struct conn *c, unsigned char *data, size_t n)
{
	static const unsigned char tail[4] = {0, 0, 0xff, 0xff};
	size_t room = msgsize + 1;

	if (!scratch)
		scratch = malloc(room);
	if (!c->z) {
		c->z = calloc(1, sizeof *c->z);
		if (!c->z || inflateInit2(c->z, -15) != Z_OK)
			return (size_t)-1;
	}
	c->z->next_out = scratch;
	c->z->avail_out = (uInt)room;
	c->z->next_in = data;
	c->z->avail_in = (uInt)n;
	if (inflate(c->z, Z_SYNC_FLUSH) < Z_OK && c->z->avail_in)
		return (size_t)-1;
	c->z->next_in = (unsigned char *)tail;
	c->z->avail_in = 4;
	int r = inflate(c->z, Z_SYNC_FLUSH);
	if (r != Z_OK && r != Z_BUF_ERROR && r != Z_STREAM_END)
		return (size_t)-1;
	size_t len = room - c->z->avail_out;
	if (server_reset || r == Z_STREAM_END)
		inflateReset(c->z);
	return len;
}

/* Consumes the whole server frames in c->in: an echo is checked and
 * counted and the next message sent; a ping is skipped; a close (or any
 * other opcode) loses the connection. */
static void frames(struct worker *w, struct conn *c, double t)
{
	size_t at = 0;
	while (c->have - at >= 2) {
		unsigned char *f = c->in + at;
		size_t n = f[1] & 0x7f, hl = 2;
		if (n == 126) {
			if (c->have - at < 4)
				break;
			n = (size_t)f[2] << 8 | f[3];
			hl = 4;
		} else if (n == 127) {
			if (c->have - at < 10)
				break;
			n = 0;
			for (int i = 2; i < 10; i++)
				n = n << 8 | f[i];
			hl = 10;
		}
		if (n > INBUF - 16) {            /* nothing this client sends comes back that big */
			w->mismatch++;
			lose(w, c);
			return;
		}
		if (c->have - at < hl + n)
			break;
		int op = f[0] & 0x0f;
		if (op == 0x9) {
			at += hl + n;
			continue;
		}
		if (op != opcode) {
			lose(w, c);
			return;
		}
		if (f[0] & 0x40) {                 /* compressed (DEFLATE): inflated, then checked */
			if (!deflate_on || !(f[0] & 0x80) || (f[1] & 0x80) ||
			    inflate_echo(c, f + hl, n) != msgsize || memcmp(scratch, payload, msgsize))
				w->mismatch++;
		}
		else if (!(f[0] & 0x80) || (f[1] & 0x80) || n != msgsize ||
		         memcmp(f + hl, payload, msgsize) != 0)
			w->mismatch++;
		at += hl + n;
		if (t >= t_wend && t < t_end)
			c->count++;
		c->last = t;
		c->sent = 0;
		if (push(w, c) < 0)
			return;
	}
	memmove(c->in, c->in + at, c->have - at);
	c->have -= at;
}

/* one event of a connection: the rest of the frame out, the server's frames in */
static void on_event(void *arg, void *ptr, uint32_t events, double t)
{
	struct worker *w = arg;
	struct conn *c = ptr;
	if (c->dead)
		return;
	if ((events & EPOLLOUT) && push(w, c) < 0)
		return;
	if (!(events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
		return;
	ssize_t r = read(c->fd, c->in + c->have, INBUF - c->have);
	if (r <= 0) {
		if (r == 0 || (errno != EAGAIN && errno != EINTR))
			lose(w, c);
		return;
	}
	c->have += (size_t)r;
	frames(w, c, t);
}

static void *run(void *arg)
{
	struct worker *w = arg;
	for (int i = 0; i < w->n; i++) {
		w->cs[i]->last = t_start;
		push(w, w->cs[i]);
	}
	closed_loop_poll(w->ep, t_end, on_event, w);
	return NULL;
}

/* Connects and upgrades, blocking; the fd (non-blocking now), -1 on failure. */
static int upgrade(const struct sockaddr_in *dst, const char *host, int port)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (const struct sockaddr *)dst, sizeof *dst) < 0) {
		perror("ws_echo_client: connect");
		return -1;
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	char req[512];
	int len = snprintf(req, sizeof req,
			   "GET /echo HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
			   "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
			   "Sec-WebSocket-Version: 13\r\n%s\r\n", host, port, deflate_on ?
			   "Sec-WebSocket-Extensions: permessage-deflate; client_no_context_takeover; "
			   "client_max_window_bits\r\n" : "");
	if (write(fd, req, (size_t)len) != len) {
		perror("ws_echo_client: write");
		return -1;
	}
	/* read the response head a byte at a time: nothing past it may be
	 * swallowed (the server sends nothing before our first message) */
	char head[2048];
	size_t got = 0;
	while (got < sizeof head - 1) {
		ssize_t r = read(fd, head + got, 1);
		if (r <= 0) {
			fprintf(stderr, "ws_echo_client: no upgrade response\n");
			return -1;
		}
		got++;
		if (got >= 4 && memcmp(head + got - 4, "\r\n\r\n", 4) == 0)
			break;
	}
	head[got] = 0;
	if (strncmp(head, "HTTP/1.1 101", 12) != 0) {
		fprintf(stderr, "ws_echo_client: upgrade refused: %.80s\n", head);
		return -1;
	}
	if (deflate_on) {
		/* the answer's parameters, lower-cased: it must be
		 * permessage-deflate (with our client_no_context_takeover) */
		for (char *p = head; *p; p++)
			if (*p >= 'A' && *p <= 'Z')
				*p += 32;
		char *ext = strstr(head, "\r\nsec-websocket-extensions:");
		if (!ext || !strstr(ext, "permessage-deflate")) {
			fprintf(stderr, "ws_echo_client: deflate not negotiated\n");
			exit(3);
		}
		char *eol = strstr(ext + 2, "\r\n");
		*eol = 0;
		server_reset = strstr(ext, "server_no_context_takeover") != NULL;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	return fd;
}

int main(int argc, char **argv)
{
	if (argc != 9 && argc != 10) {
		fprintf(stderr, "usage: %s HOST PORT CONNS SECONDS MSGSIZE WARMUP THREADS OPCODE "
			"[DEFLATE]\n", argv[0]);
		return 2;
	}
	const char *host = argv[1];
	int port = atoi(argv[2]), nconn = atoi(argv[3]), nth = atoi(argv[7]);
	double seconds = atof(argv[4]), warmup = atof(argv[6]);
	msgsize = (size_t)atol(argv[5]);
	opcode = atoi(argv[8]);
	deflate_on = argc == 10 && atoi(argv[9]);
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (inet_pton(AF_INET, host, &dst.sin_addr) != 1 || nconn < 1 || nth < 1 ||
	    msgsize < 126 || msgsize > 65535 || (opcode != 1 && opcode != 2)) {
		fprintf(stderr, "ws_echo_client: bad arguments (MSGSIZE 126..65535, OPCODE 1|2)\n");
		return 2;
	}
	payload = malloc(msgsize);
	static const unsigned char key[4] = {0x37, 0xfa, 0x21, 0x3d};
	for (size_t i = 0; i < msgsize; i++)
		payload[i] = opcode == 1 ? (unsigned char)('a' + i % 26) : (unsigned char)(i * 7);
	/* the frame's payload: the message, or (DEFLATE) its compressed bytes,
	 * one raw deflate stream sync-flushed, the 4-byte tail removed */
	unsigned char *body = payload;
	size_t bodylen = msgsize;
	if (deflate_on) {
		z_stream z = {0};
		body = malloc(msgsize + 64);
		deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -15, 8, Z_DEFAULT_STRATEGY);
		z.next_in = payload;
		z.avail_in = (uInt)msgsize;
		z.next_out = body;
		z.avail_out = (uInt)(msgsize + 64);
		deflate(&z, Z_SYNC_FLUSH);
		bodylen = msgsize + 64 - z.avail_out - 4;
		deflateEnd(&z);
	}
	size_t hl = bodylen < 126 ? 6 : 8;
	framelen = hl + bodylen;
	outframe = malloc(framelen);
	outframe[0] = 0x80 | (deflate_on ? 0x40 : 0) | (unsigned char)opcode;
	if (hl == 6)
		outframe[1] = 0x80 | (unsigned char)bodylen;
	else {
		outframe[1] = 0x80 | 126;
		outframe[2] = (unsigned char)(bodylen >> 8);
		outframe[3] = (unsigned char)bodylen;
	}
	memcpy(outframe + hl - 4, key, 4);
	for (size_t i = 0; i < bodylen; i++)
		outframe[hl + i] = body[i] ^ key[i & 3];

	struct worker *ws = calloc((size_t)nth, sizeof *ws);
	struct conn **all = calloc((size_t)nconn, sizeof *all);
	for (int t = 0; t < nth; t++) {
		ws[t].ep = epoll_create1(EPOLL_CLOEXEC);
		ws[t].cs = calloc((size_t)nconn, sizeof *ws[t].cs);
	}
	for (int i = 0; i < nconn; i++) {
		struct conn *c = calloc(1, sizeof *c);
		if ((c->fd = upgrade(&dst, host, port)) < 0)
			return 1;
		struct worker *w = &ws[i % nth];
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
		epoll_ctl(w->ep, EPOLL_CTL_ADD, c->fd, &ev);
		w->cs[w->n++] = c;
		all[i] = c;
	}
	t_start = now();
	t_wend = t_start + warmup;
	t_end = t_wend + seconds;
	for (int t = 0; t < nth; t++)
		pthread_create(&ws[t].th, NULL, run, &ws[t]);
	sleep_until(t_wend);
	double cpu0 = cpu_now(), w0 = now();
	sleep_until(t_end);
	double cpu1 = cpu_now(), w1 = now();
	long mismatch = 0, lost = 0;
	for (int t = 0; t < nth; t++) {
		pthread_join(ws[t].th, NULL);
		mismatch += ws[t].mismatch;
		lost += ws[t].lost;
	}
	long msgs = 0, mn = -1, mx = 0, stalled = 0;
	for (int i = 0; i < nconn; i++) {
		struct conn *c = all[i];
		msgs += c->count;
		if (mn < 0 || c->count < mn)
			mn = c->count;
		if (c->count > mx)
			mx = c->count;
		if (!c->dead && c->last < t_end - 1.0)
			stalled++;
	}
	printf("msgs=%ld rate=%.1f min_conn=%ld max_conn=%ld mismatch=%ld lost=%ld stalled=%ld "
	       "cpu=%.3f seconds=%.3f threads=%d\n", msgs, msgs / (w1 - w0), mn, mx, mismatch,
	       lost, stalled, cpu1 - cpu0, w1 - w0, nth);
	return 0;
}
