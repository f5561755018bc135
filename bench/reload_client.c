/* reload_client: the closed-loop HTTP/1.1 client of bench/reload_under_load.py.
 *
 *   reload_client [ADDR:]PORT N_CLOSE N_KA LONG_PATH TIMEOUT_S [LONG_TIMEOUT_S]
 *
 * One thread, one epoll instance, on ADDR:PORT (an IPv4 address; default
 * 127.0.0.1: bench/multihost.py points it at its balancer):
 *   N_CLOSE connections that each send `GET / ... Connection: close`, read
 *           the response, close, connect again: a new connection per request;
 *   N_KA    keep-alive connections: `GET /` again and again on the same
 *           connection; a response carrying `Connection: close` (or without
 *           a length) ends it and the next request goes on a new connection,
 *           which is not a failure (counted as server_close);
 *   1       long-request loop: `GET LONG_PATH` on a new connection (the app
 *           sleeps 3 s, or the server trickles 3 s of body), again as soon
 *           as it is answered, so one long request is always in flight.
 * Closed loop: each connection sends its next request as soon as the last
 * one ended (after a failure, 10 ms later: a server that is down is not
 * hammered by a spinning client).
 *
 * A response is complete at its Content-Length (or at EOF without one). The
 * body of `GET /` starts with `pid=N` (the process that answered); the first
 * time a pid answers, the client prints `newpid PID T`; at the end, for
 * each pid, `lastsent PID T C`: when the latest request it answered
 * started (T), and the latest connection whose first request it answered
 * (C: when its connect() began).
 *
 * Failures, by kind, each printed as `fail KIND T TYPE REUSED GOT ERRNO`:
 *   refused   connect() refused (ECONNREFUSED)
 *   reset     ECONNRESET / EPIPE before the response was complete
 *   eof       the server closed before the response was complete
 *   timeout   no complete response within TIMEOUT_S (LONG_TIMEOUT_S for the
 *             long request: default TIMEOUT_S + 3)
 *   non2xx    a complete response whose status is not 2xx
 *   ka_race   a keep-alive connection that had served >= 1 response and was
 *             closed (EOF or reset) by the server before any byte of the
 *             response to the next request: the server closed it while idle
 *             as the request was on its way (the classic keep-alive race;
 *             counted apart, never hidden, still a failure)
 *   other     anything else (a connect error that is not a refusal, an
 *             unparseable response)
 * T is CLOCK_MONOTONIC in seconds (Python's time.monotonic()).
 *
 * Stops at EOF on stdin or at SIGTERM/SIGINT; requests in flight then are
 * not counted. Prints one line `RESULT key=value ...`: ok (2xx responses, of
 * which ok_close / ok_ka / ok_long), long_total (long requests ended: ok or
 * failed), the failure counts, server_close, connects, max_stall_us (the
 * longest time without any completed 2xx response, from the first one to the
 * stop) and stall_end (when it ended), max_lat_us (slowest non-long 2xx
 * response).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { T_CLOSE, T_KA, T_LONG };
static const char *TYPE_NAMES[] = { "close", "ka", "long" };
enum { K_REFUSED, K_RESET, K_EOF, K_TIMEOUT, K_NON2XX, K_KA_RACE, K_OTHER, NKINDS };
static const char *KIND_NAMES[] = { "refused", "reset", "eof", "timeout", "non2xx",
				    "ka_race", "other" };
enum { S_WAIT, S_CONNECTING, S_WRITING, S_READING };

#define HEAD_MAX 8192

struct conn {
	int type;
	int state;
	int fd;
	long served;            /* responses completed on this fd */
	double t_start;         /* the current request was started */
	double t_conn;          /* its connection's connect() began */
	double t_next;          /* S_WAIT: when to start the next request */
	size_t wr_off;
	char head[HEAD_MAX];
	size_t hlen;            /* bytes in head[] (head, then the start of the body) */
	int head_done;
	int status;
	int server_close;
	long clen;              /* -1: until EOF */
	long body_got;
	long got;               /* response bytes received */
	char body[32];          /* the first bytes of the body (pid=N) */
	int blen;
	pid_t last_pid;
	int last_idx;           /* last_pid's index in seen[] */
};

static int port, epfd;
static struct in_addr server = { .s_addr = 0 };   /* set in main: ADDR, or loopback */
static char host[64] = "127.0.0.1";
static double timeout_s, long_timeout_s;
static const char *long_path;
static char req_close[256], req_ka[256], req_long[512];
static volatile sig_atomic_t stop;

static long fails[NKINDS];
static long ok, ok_type[3], long_total, server_close, connects;
static double first_ok, last_ok, max_stall, stall_end, max_lat;

static pid_t seen[65536];
static double seen_sent[65536];     /* the latest start of a request seen[i] answered */
static double seen_conn[65536];     /* the latest connect() of a connection it answered first */
static int nseen;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void set_events(struct conn *c, uint32_t ev)
{
	struct epoll_event e = { .events = ev, .data.ptr = c };
	epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &e);
}

static void drop_fd(struct conn *c)
{
	if (c->fd >= 0) {
		epoll_ctl(epfd, EPOLL_CTL_DEL, c->fd, NULL);
		close(c->fd);
	}
	c->fd = -1;
	c->served = 0;
}

static void reset_response(struct conn *c)
{
	c->hlen = 0;
	c->head_done = 0;
	c->status = 0;
	c->server_close = 0;
	c->clen = -1;
	c->body_got = 0;
	c->got = 0;
	c->blen = 0;
	c->wr_off = 0;
}

static void fail(struct conn *c, int kind, int err)
{
	double t = now();
	fails[kind]++;
	if (c->type == T_LONG)
		long_total++;
	printf("fail %s %.6f %s %ld %ld %d\n", KIND_NAMES[kind], t, TYPE_NAMES[c->type],
	       c->served, c->got, err);
	drop_fd(c);
	c->state = S_WAIT;
	c->t_next = t + 0.010;
}

/* the server closed or reset the connection before the response was whole */
static void lost(struct conn *c, int kind, int err)
{
	if (c->served > 0 && c->got == 0)
		kind = K_KA_RACE;
	fail(c, kind, err);
}

static const char *request_of(struct conn *c)
{
	return c->type == T_CLOSE ? req_close : c->type == T_KA ? req_ka : req_long;
}

static void start_request(struct conn *c)
{
	reset_response(c);
	c->t_start = now();
	if (c->fd >= 0) {                       /* a kept-alive connection */
		c->state = S_WRITING;
		set_events(c, EPOLLOUT);
		return;
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		perror("socket");
		exit(2);
	}
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	a.sin_addr = server;
	c->fd = fd;
	c->served = 0;
	c->t_conn = now();
	connects++;
	struct epoll_event e = { .events = EPOLLOUT, .data.ptr = c };
	epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &e);
	int r = connect(fd, (struct sockaddr *)&a, sizeof a);
	if (r == 0 || errno == EINPROGRESS) {
		c->state = S_CONNECTING;
		return;
	}
	fail(c, errno == ECONNREFUSED ? K_REFUSED : K_OTHER, errno);
}

/* The pid of a short request's answer: `newpid` the first time it is seen;
 * and the latest start of a request it answered (seen_sent, printed at
 * the end as `lastsent`: after a reload, every request started after the
 * old processes' latest one was answered by new code) */
static void note_pid(struct conn *c)
{
	if (c->blen < 5 || memcmp(c->body, "pid=", 4) != 0)
		return;
	c->body[c->blen < (int)sizeof c->body ? c->blen : (int)sizeof c->body - 1] = 0;
	pid_t pid = (pid_t)atol(c->body + 4);
	if (pid <= 0)
		return;
	if (pid != c->last_pid) {
		c->last_pid = pid;
		c->last_idx = -1;
		for (int i = 0; i < nseen; i++)
			if (seen[i] == pid)
				c->last_idx = i;
		if (c->last_idx < 0) {
			if (nseen >= (int)(sizeof seen / sizeof seen[0])) {
				c->last_pid = 0;        /* no slot: looked up again next time */
				return;
			}
			c->last_idx = nseen;
			seen[nseen] = pid;
			seen_sent[nseen] = seen_conn[nseen] = 0;
			nseen++;
			printf("newpid %d %.6f\n", (int)pid, now());
			fflush(stdout);
		}
	}
	if (c->t_start > seen_sent[c->last_idx])
		seen_sent[c->last_idx] = c->t_start;
	if (c->served == 1 && c->t_conn > seen_conn[c->last_idx])
		seen_conn[c->last_idx] = c->t_conn;  /* the first answer on a new connection */
}

static void complete(struct conn *c)
{
	double t = now();
	c->served++;
	if (c->status >= 200 && c->status < 300) {
		ok++;
		ok_type[c->type]++;
		if (c->type == T_LONG) {
			long_total++;
		} else {
			note_pid(c);
			if (t - c->t_start > max_lat)
				max_lat = t - c->t_start;
		}
		if (first_ok == 0) {
			first_ok = t;
		} else if (t - last_ok > max_stall) {
			max_stall = t - last_ok;
			stall_end = t;
		}
		last_ok = t;
	} else {
		fails[K_NON2XX]++;
		if (c->type == T_LONG)
			long_total++;
		printf("fail non2xx %.6f %s %ld %ld %d\n", t, TYPE_NAMES[c->type], c->served,
		       c->got, c->status);
	}
	if (c->type != T_KA || c->server_close || c->clen < 0) {
		if (c->type == T_KA)
			server_close++;
		drop_fd(c);
	}
	start_request(c);
}

/* the head is whole in c->head[0..end): status, Content-Length, Connection */
static int parse_head(struct conn *c, size_t end)
{
	if (end < 12 || memcmp(c->head, "HTTP/1.", 7) != 0)
		return -1;
	c->status = atoi(c->head + 9);
	char *p = memchr(c->head, '\n', end);
	while (p && (size_t)(p + 1 - c->head) < end) {
		char *line = p + 1;
		char *eol = memchr(line, '\n', end - (line - c->head));
		if (!eol)
			break;
		size_t n = eol - line;
		if (n >= 15 && strncasecmp(line, "content-length:", 15) == 0) {
			c->clen = atol(line + 15);
		} else if (n >= 11 && strncasecmp(line, "connection:", 11) == 0) {
			if (memmem(line, n, "close", 5) || memmem(line, n, "Close", 5))
				c->server_close = 1;
		} else if (n >= 18 && strncasecmp(line, "transfer-encoding:", 18) == 0) {
			return -1;              /* never sent by the apps of this benchmark */
		}
		p = eol;
	}
	if (c->status == 204 || c->status == 304)
		c->clen = 0;
	return 0;
}

static void body_bytes(struct conn *c, const char *b, size_t n)
{
	size_t room = sizeof c->body - 1 - c->blen;
	size_t k = n < room ? n : room;
	memcpy(c->body + c->blen, b, k);
	c->blen += k;
	c->body_got += n;
}

static void on_readable(struct conn *c)
{
	char buf[65536];
	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof buf, 0);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			lost(c, errno == ECONNRESET || errno == EPIPE ? K_RESET : K_OTHER, errno);
			return;
		}
		if (n == 0) {
			if (c->head_done && c->clen < 0) {
				complete(c);            /* a body delimited by the close */
				return;
			}
			lost(c, K_EOF, 0);
			return;
		}
		c->got += n;
		const char *b = buf;
		size_t left = n;
		if (!c->head_done) {
			size_t k = left < HEAD_MAX - c->hlen ? left : HEAD_MAX - c->hlen;
			memcpy(c->head + c->hlen, b, k);
			size_t old = c->hlen;
			c->hlen += k;
			char *e = memmem(c->head, c->hlen, "\r\n\r\n", 4);
			if (!e) {
				if (c->hlen == HEAD_MAX)
					fail(c, K_OTHER, 0);
				return;
			}
			size_t end = e + 4 - c->head;
			if (parse_head(c, end) < 0) {
				fail(c, K_OTHER, 0);
				return;
			}
			c->head_done = 1;
			/* what of this read follows the head is body */
			size_t used = end - old;
			b += used;
			left -= used;
		}
		body_bytes(c, b, left);
		if (c->clen >= 0 && c->body_got >= c->clen) {
			if (c->body_got > c->clen) {
				fail(c, K_OTHER, 0);    /* bytes nobody asked for */
				return;
			}
			complete(c);
			return;
		}
	}
}

static void on_writable(struct conn *c)
{
	if (c->state == S_CONNECTING) {
		int err = 0;
		socklen_t len = sizeof err;
		getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
		if (err) {
			fail(c, err == ECONNREFUSED ? K_REFUSED : err == ECONNRESET ? K_RESET : K_OTHER,
			     err);
			return;
		}
		c->state = S_WRITING;
	}
	const char *r = request_of(c);
	size_t len = strlen(r);
	while (c->wr_off < len) {
		ssize_t n = send(c->fd, r + c->wr_off, len - c->wr_off, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			lost(c, errno == ECONNRESET || errno == EPIPE ? K_RESET : K_OTHER, errno);
			return;
		}
		c->wr_off += n;
	}
	c->state = S_READING;
	set_events(c, EPOLLIN);
}

int main(int argc, char **argv)
{
	if (argc < 6) {
		fprintf(stderr, "usage: %s [ADDR:]PORT N_CLOSE N_KA LONG_PATH TIMEOUT_S "
			"[LONG_TIMEOUT_S]\n", argv[0]);
		return 2;
	}
	const char *colon = strrchr(argv[1], ':');
	if (colon) {
		size_t n = (size_t)(colon - argv[1]);
		if (n >= sizeof host) {
			fprintf(stderr, "address too long: %s\n", argv[1]);
			return 2;
		}
		memcpy(host, argv[1], n);
		host[n] = 0;
	}
	if (inet_pton(AF_INET, host, &server) != 1) {
		fprintf(stderr, "not an IPv4 address: %s\n", host);
		return 2;
	}
	port = atoi(colon ? colon + 1 : argv[1]);
	int n_close = atoi(argv[2]), n_ka = atoi(argv[3]);
	long_path = argv[4];
	timeout_s = atof(argv[5]);
	long_timeout_s = argc > 6 ? atof(argv[6]) : timeout_s + 3;
	snprintf(req_close, sizeof req_close,
		 "GET / HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", host, port);
	snprintf(req_ka, sizeof req_ka, "GET / HTTP/1.1\r\nHost: %s:%d\r\n\r\n", host, port);
	snprintf(req_long, sizeof req_long,
		 "GET %s HTTP/1.1\r\nHost: %s:%d\r\nConnection: close\r\n\r\n", long_path,
		 host, port);
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	signal(SIGPIPE, SIG_IGN);
	epfd = epoll_create1(EPOLL_CLOEXEC);
	int n = n_close + n_ka + (long_path[0] ? 1 : 0);
	struct conn *conns = calloc(n, sizeof *conns);
	struct epoll_event e = { .events = EPOLLIN, .data.ptr = NULL };
	epoll_ctl(epfd, EPOLL_CTL_ADD, 0, &e);  /* stdin: EOF stops */
	for (int i = 0; i < n; i++) {
		conns[i].type = i < n_close ? T_CLOSE : i < n_close + n_ka ? T_KA : T_LONG;
		conns[i].fd = -1;
		start_request(&conns[i]);
	}
	printf("start %.6f\n", now());
	fflush(stdout);
	struct epoll_event evs[256];
	while (!stop) {
		int k = epoll_wait(epfd, evs, 256, 20);
		for (int i = 0; i < k; i++) {
			struct conn *c = evs[i].data.ptr;
			if (!c) {
				char tmp[256];
				if (read(0, tmp, sizeof tmp) <= 0)
					stop = 1;
				continue;
			}
			if (c->fd < 0 || c->state == S_WAIT)
				continue;               /* dropped earlier in this batch */
			if (c->state == S_READING)
				on_readable(c);
			else
				on_writable(c);
		}
		double t = now();
		for (int i = 0; i < n; i++) {
			struct conn *c = &conns[i];
			if (c->state == S_WAIT) {
				if (t >= c->t_next)
					start_request(c);
			} else if (t - c->t_start > (c->type == T_LONG ? long_timeout_s : timeout_s)) {
				fail(c, K_TIMEOUT, 0);
			}
		}
		fflush(stdout);
	}
	double t = now();
	if (first_ok > 0 && t - last_ok > max_stall) {
		max_stall = t - last_ok;
		stall_end = t;
	}
	for (int i = 0; i < nseen; i++)
		printf("lastsent %d %.6f %.6f\n", (int)seen[i], seen_sent[i], seen_conn[i]);
	printf("RESULT ok=%ld ok_close=%ld ok_ka=%ld ok_long=%ld long_total=%ld", ok,
	       ok_type[T_CLOSE], ok_type[T_KA], ok_type[T_LONG], long_total);
	for (int i = 0; i < NKINDS; i++)
		printf(" %s=%ld", KIND_NAMES[i], fails[i]);
	printf(" server_close=%ld connects=%ld max_stall_us=%ld stall_end=%.6f max_lat_us=%ld "
	       "first_ok=%.6f stop=%.6f\n", server_close, connects, (long)(max_stall * 1e6),
	       stall_end, (long)(max_lat * 1e6), first_ok, t);
	fflush(stdout);
	return 0;
}
