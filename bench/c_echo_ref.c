/* c_echo_ref: the C reference echo server of bench/echo_bench.py (issue 20).
 *
 *   c_echo_ref PORT [PROCS]          (PROCS default 2)
 *
 * The parent forks PROCS children; each binds its own listener on
 * 127.0.0.1:PORT with SO_REUSEPORT (backlog 2048), so the kernel spreads the
 * connections over the processes by hash, as it does for the asyncio and
 * uvloop peers (a shared listener lets one process take most of a burst of
 * connects: long-lived echo connections stay where they landed). Once every
 * child listens the parent prints "ready PORT"; TERM or INT to the parent
 * kills the children (each also has PR_SET_PDEATHSIG). A child prints
 * "child PID connections=N" to stdout on TERM.
 *
 * Each child: one epoll instance, connections level-triggered, a 64 KiB
 * buffer per connection. What is read is written back at once; what the
 * socket does not take waits in the buffer, and the connection stops reading
 * (EPOLLOUT only) until it is written: the least an echo server with bounded
 * memory does. No timeouts, no limits on connections: a floor, not a server.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <string.h>
#include <sys/prctl.h>

#include "c_ref.h"

#define BUF 65536

struct conn {
    int fd;
    size_t len, off;      /* unwritten bytes are buf[off, len) */
    int want_out;         /* registered for EPOLLOUT instead of EPOLLIN */
    char buf[BUF];
};

static int epfd;
static long accepted;
static volatile sig_atomic_t child_stop;

static void on_child_term(int sig)
{
    (void)sig;
    child_stop = 1;
}

static void drop(struct conn *c)
{
    close(c->fd);         /* also leaves the epoll set */
    free(c);
}

static void on_conn(struct conn *c)
{
    if (!c->want_out) {   /* EPOLLIN, EPOLLHUP or EPOLLERR: read tells which */
        ssize_t n = read(c->fd, c->buf, BUF);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) { drop(c); return; }
        if (n < 0) return;
        c->len = (size_t)n;
        c->off = 0;
    }
    int r = ref_flush(c->fd, c->buf, &c->off, &c->len);
    if (r < 0) { drop(c); return; }
    ref_want_out(epfd, c->fd, c, &c->want_out, r == 0);
}

static void child_loop(int port, int readyfd)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    struct sigaction act = {.sa_handler = on_child_term};
    sigemptyset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    /* TERM is let in only inside epoll_pwait: none can slip in between the
     * check of child_stop and the wait */
    sigset_t term, waitmask;
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, &waitmask);
    sigdelset(&waitmask, SIGTERM);
    int lfd = ref_listen(port, 1);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epfd < 0 || epoll_ctl(epfd, EPOLL_CTL_ADD, lfd, &lev) < 0) { perror("epoll"); _exit(1); }
    if (write(readyfd, "l", 1) != 1) _exit(1);   /* listening: the parent counts these */
    close(readyfd);
    struct epoll_event evs[256];
    while (!child_stop) {
        int n = epoll_pwait(epfd, evs, 256, -1, &waitmask);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("epoll_wait");
            _exit(1);
        }
        for (int i = 0; i < n; i++) {
            if (evs[i].data.ptr != NULL) {
                on_conn(evs[i].data.ptr);
                continue;
            }
            for (;;) {
                int fd = ref_accept(lfd);
                if (fd < 0) break;
                struct conn *c = malloc(sizeof *c);
                if (c == NULL) { close(fd); continue; }
                c->fd = fd;
                c->len = c->off = 0;
                c->want_out = 0;
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) < 0) { close(fd); free(c); continue; }
                accepted++;
            }
        }
    }
    printf("child %d connections=%ld\n", (int)getpid(), accepted);
    fflush(stdout);
    _exit(0);
}

int main(int argc, char **argv)
{
    int port, procs;
    ref_args(argc, argv, "c_echo_ref", &port, &procs);
    ref_catch_stop();

    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0) { perror("pipe"); return 1; }
    pid_t kids[64];
    int started = 0;
    for (int i = 0; i < procs && !ref_stop; i++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); ref_stop = SIGTERM; break; }
        if (pid == 0) {
            signal(SIGINT, SIG_DFL);
            if (getppid() == 1) _exit(0);
            close(pipefd[0]);
            child_loop(port, pipefd[1]);
        }
        kids[started++] = pid;
    }
    close(pipefd[1]);
    int listening = 0;
    char b[64];
    while (listening < started && !ref_stop) {
        ssize_t n = read(pipefd[0], b, sizeof b);
        if (n > 0) listening += (int)n;
        else if (n == 0 || errno != EINTR) break;   /* a child died before listening */
    }
    close(pipefd[0]);
    if (!ref_stop && listening == procs) {
        printf("ready %d\n", port);
        fflush(stdout);
    } else if (!ref_stop) {
        fprintf(stderr, "c_echo_ref: %d of %d children listening\n", listening, procs);
        ref_stop = SIGUSR1;
    }
    /* TERM to each child: it prints its connection count and exits */
    return ref_reap("c_echo_ref", kids, started);
}
