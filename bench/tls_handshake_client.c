/* tls_handshake_client: full TLS handshakes per second against an HTTPS server
 * (bench/tls_hello.py, issue 24 §2).
 *
 *   tls_handshake_client PORT CONNS SECONDS
 *
 * CONNS threads, each in a closed loop until SECONDS have passed: connect to
 * 127.0.0.1:PORT, a full TLS handshake (a fresh SSL object and never a saved
 * session: no resumption, which wrk does on its reconnects), one
 * `GET / HTTP/1.1` with `Connection: close`, the response read to the end of
 * its Content-Length body, close_notify sent, close(2). Prints one line in the
 * form of http_hello.py's wrk Lua (so its parser reads both):
 *
 *   RESULT requests=N duration_us=D bytes=B connect=E read=0 write=0 status=S
 *          timeout=0 p50=.. p90=.. p99=.. max=.. mean=.. reused=R
 *
 * `connect` counts every failed connection (connect, handshake, write or a
 * response cut short), `status` the answers that are not 200 with the hello
 * body; latencies in µs, from connect to the whole response. `reused` counts
 * handshakes OpenSSL reports resumed: always 0 unless the client is wrong.
 * Certificates are not verified (a self-signed one made at bench time): the
 * server's CertificateVerify signature is still checked, as in any TLS 1.3
 * handshake. Why threads and blocking calls: the cost of a handshake is the
 * public-key work on both sides; a thread per connection keeps this client
 * short and its own overhead (a context switch per read) far below that.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int port;
static double seconds;
static SSL_CTX *ctx;
static struct timespec t_start;

struct result {
    long requests, errors, status, reused, bytes;
    long n, cap;
    long *lat_us;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t_start.tv_sec) + (t.tv_nsec - t_start.tv_nsec) / 1e9;
}

/* One request on a new connection: 0 ok, 1 a connection/TLS error, 2 a bad answer. */
static int one(struct result *r, const char *req, size_t req_len)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 1;
    int one_ = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one_, sizeof one_);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        close(fd);
        return 1;
    }
    SSL *ssl = SSL_new(ctx);
    int rc = 1;
    if (!ssl || !SSL_set_fd(ssl, fd) || SSL_connect(ssl) != 1)
        goto out;
    if (SSL_session_reused(ssl))
        r->reused++;
    if (SSL_write(ssl, req, (int)req_len) != (int)req_len)
        goto out;
    char buf[16384];
    size_t got = 0;
    long need = -1;                     /* head + body length, once the head is in */
    for (;;) {
        int n = SSL_read(ssl, buf + got, (int)(sizeof buf - 1 - got));
        if (n <= 0)
            break;
        got += (size_t)n;
        buf[got] = 0;
        if (need < 0) {
            char *end = strstr(buf, "\r\n\r\n");
            if (end) {
                char *cl = strcasestr(buf, "\r\ncontent-length:");
                need = (end + 4 - buf) + (cl && cl < end ? atol(cl + 17) : 0);
            }
        }
        if ((need >= 0 && (long)got >= need) || got == sizeof buf - 1)
            break;
    }
    if (need < 0 || (long)got < need) {
        rc = 1;
        goto out;
    }
    r->bytes += (long)got;
    rc = strncmp(buf, "HTTP/1.1 200", 12) == 0 && strstr(buf, "\r\n\r\nHello, world!") ? 0 : 2;
    SSL_shutdown(ssl);                  /* our close_notify; the server's is not awaited */
out:
    if (ssl)
        SSL_free(ssl);
    close(fd);
    return rc;
}

static void *run(void *arg)
{
    struct result *r = arg;
    char req[128];
    int len = snprintf(req, sizeof req,
                       "GET / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", port);
    while (now_s() < seconds) {
        double t0 = now_s();
        int rc = one(r, req, (size_t)len);
        ERR_clear_error();
        if (rc == 1) {
            r->errors++;
            continue;
        }
        if (rc == 2)
            r->status++;
        r->requests++;
        if (r->n == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 4096;
            r->lat_us = realloc(r->lat_us, r->cap * sizeof *r->lat_us);
            if (!r->lat_us) {
                perror("realloc");
                exit(2);
            }
        }
        r->lat_us[r->n++] = (long)((now_s() - t0) * 1e6);
    }
    return NULL;
}

static int cmp_long(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s PORT CONNS SECONDS\n", argv[0]);
        return 2;
    }
    port = atoi(argv[1]);
    int conns = atoi(argv[2]);
    seconds = atof(argv[3]);
    if (port <= 0 || conns <= 0 || seconds <= 0) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        ERR_print_errors_fp(stderr);
        return 2;
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, NULL);
    /* no client-side session cache and no tickets asked for: every handshake is full */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET | SSL_OP_IGNORE_UNEXPECTED_EOF);
    struct result *res = calloc((size_t)conns, sizeof *res);
    pthread_t *th = calloc((size_t)conns, sizeof *th);
    if (!res || !th)
        return 2;
    clock_gettime(CLOCK_MONOTONIC, &t_start);
    for (int i = 0; i < conns; i++)
        if (pthread_create(&th[i], NULL, run, &res[i]) != 0) {
            perror("pthread_create");
            return 2;
        }
    struct result tot = {0};
    for (int i = 0; i < conns; i++) {
        pthread_join(th[i], NULL);
        tot.requests += res[i].requests;
        tot.errors += res[i].errors;
        tot.status += res[i].status;
        tot.reused += res[i].reused;
        tot.bytes += res[i].bytes;
        tot.n += res[i].n;
    }
    double dur = now_s();
    long *all = malloc((size_t)(tot.n ? tot.n : 1) * sizeof *all), k = 0;
    for (int i = 0; i < conns; i++) {
        if (res[i].n)
            memcpy(all + k, res[i].lat_us, (size_t)res[i].n * sizeof *all);
        k += res[i].n;
    }
    qsort(all, (size_t)tot.n, sizeof *all, cmp_long);
    double mean = 0;
    for (long i = 0; i < tot.n; i++)
        mean += (double)all[i] / (double)tot.n;
#define PCT(p) (tot.n ? all[(long)((tot.n - 1) * (p))] : 0)
    printf("RESULT requests=%ld duration_us=%ld bytes=%ld connect=%ld read=0 write=0 status=%ld "
           "timeout=0 p50=%ld p90=%ld p99=%ld max=%ld mean=%.1f reused=%ld\n", tot.requests,
           (long)(dur * 1e6), tot.bytes, tot.errors, tot.status, PCT(0.50), PCT(0.90), PCT(0.99),
           tot.n ? all[tot.n - 1] : 0, mean, tot.reused);
    return 0;
}
