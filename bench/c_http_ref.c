/* c_http_ref: the C reference server of bench/http_hello.py (issue 8).
 *
 *   c_http_ref PORT [PROCS]          (PROCS default 2)
 *
 * The parent binds 127.0.0.1:PORT (backlog 2048), forks PROCS children that
 * share that one listener, prints "ready PORT" on stdout and waits; TERM or
 * INT to the parent kills the children (each also has PR_SET_PDEATHSIG).
 * Each child: one epoll instance, the listener registered EPOLLEXCLUSIVE,
 * accept4 until EAGAIN, connections level-triggered with a 16 KiB input
 * buffer. "Parsing" is the least a keep-alive hello needs: every "\r\n\r\n"
 * ends a request (pipelined ones are answered in order, in one write); the
 * head is searched case-insensitively for "connection: close", which gets
 * the same answer with "Connection: close" and a close after it is written.
 * No bodies, no timeouts, no validation: a floor for the response path, not
 * a server.
 */
#define _GNU_SOURCE
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>

#include "c_ref.h"

#define INBUF 16384
#define OUTBUF 65536

static const char RESP_KA[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n\r\nHello, world!";
static const char RESP_CLOSE[] =
    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 13\r\n"
    "Connection: close\r\n\r\nHello, world!";

struct conn {
    int fd;
    size_t in_len;
    size_t out_len, out_off;
    int closing;          /* close once the output is written */
    int want_out;         /* EPOLLOUT registered */
    char in[INBUF];
    char out[OUTBUF];
};

static int epfd;

static void conn_free(struct conn *c)
{
    close(c->fd);         /* also removes it from the epoll set */
    free(c);
}

static int flush_out(struct conn *c)
{
    return ref_flush(c->fd, c->out, &c->out_off, &c->out_len);
}

static void set_events(struct conn *c, int want_out)
{
    ref_want_out(epfd, c->fd, c, &c->want_out, want_out);
}

static int head_says_close(const char *head, size_t len)
{
    const char *p = head, *end = head + len;
    while ((p = memmem(p, (size_t)(end - p), "\r\n", 2)) != NULL) {
        p += 2;
        if ((size_t)(end - p) >= 17 && strncasecmp(p, "connection: close", 17) == 0)
            return 1;
    }
    return 0;
}

/* answers every complete head in the input; -1: close the connection now */
static int handle_input(struct conn *c)
{
    size_t off = 0;
    for (;;) {
        char *end = memmem(c->in + off, c->in_len - off, "\r\n\r\n", 4);
        if (end == NULL) break;
        size_t hlen = (size_t)(end - (c->in + off)) + 4;
        int close_it = head_says_close(c->in + off, hlen - 2);
        const char *r = close_it ? RESP_CLOSE : RESP_KA;
        size_t rl = close_it ? sizeof RESP_CLOSE - 1 : sizeof RESP_KA - 1;
        if (c->out_len + rl > OUTBUF) break;       /* answer the rest later */
        memcpy(c->out + c->out_len, r, rl);
        c->out_len += rl;
        off += hlen;
        if (close_it) { c->closing = 1; off = c->in_len; break; }
    }
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    if (c->in_len == INBUF) return -1;              /* a head larger than the buffer */
    return 0;
}

/* answers what the input holds, writing as it goes; -1: c was freed */
static int pump(struct conn *c)
{
    for (;;) {
        if (handle_input(c) < 0) { conn_free(c); return -1; }
        if (c->out_len == 0) { set_events(c, 0); return 0; }
        int r = flush_out(c);
        if (r < 0) { conn_free(c); return -1; }
        if (r == 0) { set_events(c, 1); return 0; }   /* wait for EPOLLOUT */
        if (c->closing) { conn_free(c); return -1; }
    }
}

static void on_conn(struct conn *c, unsigned events)
{
    if (c->want_out) {                /* registered for EPOLLOUT only */
        int r = flush_out(c);
        if (r < 0) { conn_free(c); return; }
        if (r == 0) return;
        if (c->closing) { conn_free(c); return; }
        pump(c);
        return;
    }
    (void)events;                     /* EPOLLIN, EPOLLHUP, EPOLLERR: read tells */
    ssize_t n = read(c->fd, c->in + c->in_len, INBUF - c->in_len);
    if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) return;
        conn_free(c);
        return;
    }
    if (n == 0) { conn_free(c); return; }
    c->in_len += (size_t)n;
    pump(c);
}

static void child_loop(int lfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0) { perror("epoll_create1"); _exit(1); }
    struct epoll_event lev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = NULL};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &lev) < 0) { perror("epoll_ctl listener"); _exit(1); }
    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(epfd, evs, 256, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            _exit(1);
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr == NULL) {
                for (;;) {
                    int fd = ref_accept(lfd);
                    if (fd < 0) break;
                    struct conn *c = malloc(sizeof *c);
                    if (c == NULL) { close(fd); continue; }
                    c->fd = fd;
                    c->in_len = c->out_len = c->out_off = 0;
                    c->closing = c->want_out = 0;
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) { close(fd); free(c); }
                }
            } else {
                on_conn(evs[i].data.ptr, evs[i].events);
            }
        }
    }
}

int main(int argc, char **argv)
{
    int port, procs;
    ref_args(argc, argv, "c_http_ref", &port, &procs);
    int lfd = ref_listen(port, 0);
    ref_catch_stop();

    pid_t kids[64];
    for (int i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); ref_stop = SIGTERM; procs = i; break; }
        if (pid == 0) {
            signal(SIGTERM, SIG_DFL);
            signal(SIGINT, SIG_DFL);
            if (getppid() == 1) _exit(0);
            child_loop(lfd);
        }
        kids[i] = pid;
    }
    if (!ref_stop) {
        printf("ready %d\n", port);
        fflush(stdout);
    }
    return ref_reap("c_http_ref", kids, procs);
}
