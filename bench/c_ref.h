/* c_ref.h: what bench's two C reference servers (c_echo_ref.c for
 * echo_bench.py, c_http_ref.c for http_hello.py) share, header-only since
 * each is built by one gcc call (benchlib.build_c): the command line, a
 * loopback listener, the accept, a connection's output written and its
 * epoll interest switched, and the parent's supervision of its children.
 * What each child does with its bytes stays in its own file.
 */
#ifndef BENCH_C_REF_H
#define BENCH_C_REF_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* NAME PORT [PROCS] (PROCS default 2, at most 64); exits 2 on a bad one */
static void ref_args(int argc, char **argv, const char *name, int *port, int *procs)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PORT [PROCS]\n", argv[0]);
        exit(2);
    }
    *port = atoi(argv[1]);
    *procs = argc > 2 ? atoi(argv[2]) : 2;
    if (*port < 1 || *port > 65535 || *procs < 1 || *procs > 64) {
        fprintf(stderr, "%s: bad PORT or PROCS\n", name);
        exit(2);
    }
}

/* A non-blocking listener on 127.0.0.1:port (backlog 2048), with
 * SO_REUSEPORT if reuseport; exits 1 if it cannot bind or listen. */
static int ref_listen(int port, int reuseport)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (reuseport)
        setsockopt(lfd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    if (bind(lfd, (struct sockaddr *)&sa, sizeof sa) < 0) { perror("bind"); _exit(1); }
    if (listen(lfd, 2048) < 0) { perror("listen"); _exit(1); }
    return lfd;
}

/* The next connection (non-blocking, TCP_NODELAY), or -1: EAGAIN (none
 * left, or another child took it), EMFILE... */
static int ref_accept(int lfd)
{
    int one = 1, fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0)
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Writes buf[*off, *len) to fd. 1: everything written (*off and *len
 * reset to 0); 0: EAGAIN left some; -1: error */
static int ref_flush(int fd, const char *buf, size_t *off, size_t *len)
{
    while (*off < *len) {
        ssize_t n = write(fd, buf + *off, *len - *off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN ? 0 : -1;
        }
        *off += (size_t)n;
    }
    *len = *off = 0;
    return 1;
}

/* fd (its event data ptr) registered for EPOLLOUT instead of EPOLLIN
 * (want 1) or back (want 0); *cur says which it is now */
static void ref_want_out(int epfd, int fd, void *ptr, int *cur, int want)
{
    if (want == *cur) return;
    struct epoll_event ev = {.events = want ? EPOLLOUT : EPOLLIN, .data.ptr = ptr};
    epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
    *cur = want;
}

/* ---- the parent ---- */

/* TERM or INT to the parent (or a failure of its own: SIGUSR1) */
static volatile sig_atomic_t ref_stop;
static void ref_on_stop(int sig) { ref_stop = sig; }

static void ref_catch_stop(void)
{
    signal(SIGPIPE, SIG_IGN);
    struct sigaction act = {.sa_handler = ref_on_stop};
    sigemptyset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
}

/* Waits for the n children: once ref_stop is set each gets TERM, once; a
 * child that dies on its own stops the others. The parent's exit status:
 * 0 when TERM or INT stopped it, 1 after a failure. */
static int ref_reap(const char *name, const pid_t *kids, int n)
{
    int alive = n, sent = 0;
    while (alive > 0) {
        if (ref_stop && !sent) {
            for (int i = 0; i < n; i++) kill(kids[i], SIGTERM);
            sent = 1;
        }
        int st;
        pid_t w = wait(&st);
        if (w > 0) {
            alive--;
            if (!ref_stop) {      /* a child died on its own: take the others along */
                fprintf(stderr, "%s: child %d died (status %d)\n", name, (int)w, st);
                ref_stop = SIGUSR1;
            }
        } else if (errno == ECHILD) {
            break;
        }
    }
    return ref_stop == SIGTERM || ref_stop == SIGINT ? 0 : 1;
}

#endif /* BENCH_C_REF_H */
