/* Shared scaffolding of the fdcore stress programs (tests/c/stress_*.c).
 *
 * What every scenario relies on:
 *  - a per-fd record of the incarnation the test inserted (cookie, generation,
 *    live flag), written *before* fdc_insert() so that any poller handed an
 *    event can compare it with what the core reports;
 *  - the FDC_HK_CLOSE_END hook, which turns "exactly one close per
 *    incarnation" into a CAS live 1 -> 0 on that record (a second close of the
 *    same incarnation, or a close of something never inserted, fails);
 *  - check_event(), run by every handler while it holds the running bit;
 *  - check_quiescent(), run while no thread polls, comparing the fd table,
 *    polled_mask and the kernel's epoll interest lists (/proc fdinfo);
 *  - a watchdog thread aborting when a worker makes no progress for a while.
 * Every failure prints "FAIL:" with the place and aborts (non-zero exit, and
 * the sanitizers print their own report first if they have one).
 */
#ifndef SOCKHERD_TESTS_C_COMMON_H
#define SOCKHERD_TESTS_C_COMMON_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fd.h"

#define MAX_THREADS  16
_Static_assert(sizeof(struct fdc_counters) == FDC_NCOUNTERS * sizeof(uint64_t), "counters");
#define COOKIE_FDBITS 20            /* cookie = serial << 20 | fd */
#define COOKIE_FDMASK ((1u << COOKIE_FDBITS) - 1)

enum { KIND_CONN = 1, KIND_LISTENER = 2 };
enum { X_COOWNED = 1, X_SEND = 2 };          /* takeover -x bits */
enum { XC_SHARED = 1, XC_HANDOVER = 2 };     /* coown -x bits (stress_coown.c) */
enum { XS_CHAOS = 1 };                       /* shared -x bits (stress_shared.c) */

/* ---- failing loudly ---- */
void fail_at(const char *file, int line, int fd, const char *fmt, ...)
	__attribute__((noreturn, format(printf, 4, 5)));
#define FAIL(...)          fail_at(__FILE__, __LINE__, -1, __VA_ARGS__)
#define FAILFD(fd, ...)    fail_at(__FILE__, __LINE__, (fd), __VA_ARGS__)
#define CHECK(c, ...)      do { if (!(c)) FAIL("check `" #c "` failed: " __VA_ARGS__); } while (0)
#define CHECKFD(fd, c, ...) do { if (!(c)) FAILFD((fd), "check `" #c "` failed: " __VA_ARGS__); } while (0)
/* a syscall returning -1 + errno on failure */
#define SYS(expr) ({                                   \
	long _r = (long)(expr);                         \
	if (_r < 0)                                     \
		FAIL("%s: %s", #expr, strerror(errno)); \
	_r;                                             \
})

/* ---- options (argv, then environment for long runs) ---- */
struct opts {
	const char *mode;
	int nthreads, ngroups;
	double seconds;          /* wall-clock bound of the main phase */
	long iters;              /* per-thread iteration bound */
	uint64_t seed;
	int widen;               /* 1 in `widen` hook calls yields (0: never) */
	double watchdog;         /* seconds without progress before abort */
	double pause;            /* seconds between mid-run quiescent points */
	int chaos;               /* 1 in `chaos` iterations touches a random fd */
	int extended;            /* -x bits, takeover scenario: X_COOWNED, X_SEND
	                            (see stress_takeover.c); coown scenario:
	                            XC_SHARED, XC_HANDOVER (stress_coown.c) */
	int busy;                /* busy-loop threads beside the workers, so that
	                            workers get preempted inside the protocols */
	int nomem;               /* -m: the core's realloc fails 1 in `nomem`
	                            calls (0: never); see nomem_point */
	int epfail;              /* -e: the pollers' epoll_ctl ADD and MOD fail
	                            1 in `epfail` calls (0: never); see
	                            __wrap_epoll_ctl in common.c */
};
extern struct opts g_opt;

/* ---- the run ---- */
struct run {
	struct fdc_table *t;
	int maxfd;
	pthread_barrier_t bar;
	_Atomic int stop;                       /* main phase over */
	_Atomic int pause_req, pause_ack;       /* mid-run quiescent points */
	_Atomic long iters_done[MAX_THREADS];
	_Atomic uint64_t progress[MAX_THREADS]; /* bumped by workers */
	_Atomic int busy[MAX_THREADS];          /* 0 while legitimately waiting */
	_Atomic int waiting[MAX_THREADS];       /* set at FDC_HK_BEFORE_WAIT (the hook);
	                                           a scenario clears it after fdc_poll */
	_Atomic uint64_t inserts, closes, serial;
	_Atomic uint64_t events, deferred, handler_deletes;
};
extern struct run g_run;

/* per-fd record of the incarnation the test inserted */
struct fdrec {
	_Atomic uint64_t cookie;
	_Atomic uint32_t gen;
	_Atomic uint32_t live;
	_Atomic uint32_t kind;
};
extern struct fdrec *g_rec;

/* Per fd number: handlers of the test currently inside it (counted after
 * fdc_enter() said DONE, uncounted before fdc_leave() or a delete from the
 * handler). A close while it is non-zero is a close under a running thread:
 * the close hook fails on it. Scenarios that do not count leave it at 0.
 */
extern _Atomic int *g_inside;

/* thread-local: closes this OS thread performed (counted by the hook) */
extern _Thread_local uint64_t tl_closes;
/* Out of memory on purpose (-m N; the program is linked with
 * -Wl,--wrap=realloc, so the core's realloc calls come to common.c): each
 * fails 1 in N. The core reallocates only to grow a thread's owed list,
 * which then stays grown, so a poller calls nomem_point before each poll:
 * 1 in 2 times it gives back its owed list when empty (th's own thread,
 * between its polls: nobody else touches it), and the next report it owes
 * needs memory again. Kept-edge replays and failed registrations' reports
 * then take the retry path (poller_owed.c, retry_later) all through the run. */
void nomem_point(struct fdc_thread *th);
extern _Atomic uint64_t g_nomem_fails;
/* Failed registrations on purpose (-e N; linked with -Wl,--wrap=epoll_ctl):
 * during the main phase, an ADD or a MOD on a poller's epoll instance fails
 * 1 in N (ENOMEM or ENOSPC, as the kernel answers at max_user_watches),
 * without reaching the kernel. g_epfail_fails counts them; g_ctlfail[fd] is
 * set for the incarnation they hit (reset by the inserts, before the
 * insert): a group-shared connection's sibling may do without its
 * registration, unreported (fdc_insert_shared), so the quiescent check's
 * "every owner polls it" is not asked of such an fd. Every other failure
 * must be reported to an owner (FDC_POLL_CTL): the quiescent check then
 * finds each live fd carrying FDC_POLL_CTL owed or listed for a retry by a
 * thread of its group (its report not yet made), or told to a handler
 * (g_ctltold, below). */
extern _Atomic uint64_t g_epfail_fails;
extern _Atomic uint8_t *g_ctlfail;
/* A handler was told of a failed registration of fd's live incarnation
 * (FDC_POLL_CTL): reset by the inserts, set by ctl_told(). A listener
 * lives on after it (its thread makes the registration again: poller_owed.c,
 * fail_fd), and the quiescent check then asks that every owner polls it
 * or has it listed for that (FDC_RETRY_ADD). */
extern _Atomic uint8_t *g_ctltold;
void ctl_told(int fd);
/* Whether th owes (or lists for a retry) the report of a failed
 * registration of incarnation gen of fd. th's own thread, or anyone while
 * th is stopped. */
int ctl_report_owed(struct fdc_thread *th, int fd, uint32_t gen);
/* The kernel's registration of fd in epoll instance epfd (its
 * /proc/self/fdinfo): its events | 1 << 32, or 0 if none; *data (if
 * given) its epoll data. */
uint64_t kernel_registration(int epfd, int fd, uint64_t *data);

/* fdc_takeover, checking that a close it performed (a racing delete turned
 * the takeover into the deferred close) happened once and returned -ESTALE;
 * such a close is counted in *closed. */
int checked_takeover(struct fdc_thread *th, int fd, uint64_t cookie, _Atomic uint64_t *closed);
extern _Thread_local uint64_t tl_rng;

static inline uint64_t rnd(void)
{
	/* xorshift64*: cheap, per thread, reproducible from the seed */
	tl_rng ^= tl_rng >> 12;
	tl_rng ^= tl_rng << 25;
	tl_rng ^= tl_rng >> 27;
	return tl_rng * 0x2545F4914F6CDD1DULL;
}
static inline unsigned rndn(unsigned n) { return (unsigned)(rnd() % n); }
static inline int chance(unsigned n) { return rndn(n) == 0; } /* 1 in n */

void seed_thread(int idx);
double now_s(void);

/* table with the close hook installed; records sized to maxfd */
void run_init(void);
void run_fini(void);        /* final checks, frees the table */

/* Inserts fd for (tgid, mask) after recording the incarnation; returns the
 * cookie. Fails loudly on any error.
 */
uint64_t tst_insert(int fd, uint32_t kind, int tgid, uint64_t mask, uint32_t flags);
/* fdc_delete() with the "1 means I closed it now" accounting checked */
int tst_delete(struct fdc_thread *th, int fd, uint64_t cookie);
/* fdc_leave() after a handler; checks "CLOSED iff ... " where decidable */
int tst_leave(struct fdc_thread *th, const struct fdc_event *ev);
/* the handler-side checks, while holding the running bit */
void check_event(struct fdc_thread *th, const struct fdc_event *ev);

/* allow_stale_polled: takeover leaves the old owner registered until it
 * next sees the fd, so polled bits outside thread_mask are tolerated there.
 */
void check_quiescent(int allow_stale_polled);

/* Every worker calls it once its loop is over and it polls no more: each
 * applies its pending updates, then thread 0 runs check_quiescent().
 */
void quiescent_point(struct fdc_thread *th, int allow_stale);

/* the worker bookkeeping around barriers (the watchdog skips idle ones) */
void bar_wait(int tid);
static inline void tick(int tid) { atomic_fetch_add_explicit(&g_run.progress[tid], 1, memory_order_relaxed); }
/* At the top of each worker loop iteration: counts it, joins a mid-run
 * quiescent point if main asked for one, returns 0 once the run is over.
 */
int worker_continue(struct fdc_thread *th, int allow_stale);

void watchdog_start(void);
void watchdog_stop(void);
void print_counters(const char *mode, double elapsed, const char *extra);

int count_open_fds(void);

/* stress_fd.c: run the workers until their iterations or the deadline */
double run_threads(void *(*fn)(void *), void *(*extra)(void *));

int run_churn(void);
int run_takeover(void);
int run_listener(void);
int run_coown(void);
int run_shared(void);

#endif
