/* Shared scaffolding of the fdcore stress programs: see common.h. */
#define _GNU_SOURCE
#include "common.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdarg.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

struct opts g_opt;
struct run g_run;
struct fdrec *g_rec;
_Atomic int *g_inside;
_Thread_local uint64_t tl_closes;
/* non-zero start: the hook may run on a thread that never called seed_thread */
_Thread_local uint64_t tl_rng = 0x9E3779B97F4A7C15ULL;

_Atomic uint64_t g_nomem_fails;
/* its own generator: -m leaves the other random choices of a seed alone */
static _Thread_local uint64_t tl_nomem_rng = 0x2545F4914F6CDD1DULL;

void *__real_realloc(void *p, size_t n);

void *__wrap_realloc(void *p, size_t n)
{
	if (g_opt.nomem > 0) {
		tl_nomem_rng ^= tl_nomem_rng >> 12;
		tl_nomem_rng ^= tl_nomem_rng << 25;
		tl_nomem_rng ^= tl_nomem_rng >> 27;
		if ((tl_nomem_rng * 0x2545F4914F6CDD1DULL >> 33) % (unsigned)g_opt.nomem == 0) {
			atomic_fetch_add(&g_nomem_fails, 1);
			return NULL;
		}
	}
	return __real_realloc(p, n);
}

void nomem_point(struct fdc_thread *th)
{
	if (g_opt.nomem > 0 && !th->nbowed && th->owed && chance(2)) {
		free(th->owed);
		th->owed = NULL;
		th->capowed = 0;
	}
}

_Atomic uint64_t g_epfail_fails;
_Atomic uint8_t *g_ctlfail;
_Atomic uint8_t *g_ctltold;
static _Thread_local uint64_t tl_epfail_rng = 0x106689D45497FDB5ULL;

int __real_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev);

int __wrap_epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	struct fdc_table *t = g_run.t;

	/* the pollers' registrations only, in the main phase: not insert's
	 * probe (its scratch instance), nor a DEL (what a DEL alone wants is
	 * nothing registered, which a failure would not give) */
	if (g_opt.epfail > 0 && t && epfd != t->probe_epfd && !atomic_load(&g_run.stop) &&
	    (op == EPOLL_CTL_ADD || op == EPOLL_CTL_MOD) && fd >= 0 && fd < g_run.maxfd) {
		tl_epfail_rng ^= tl_epfail_rng >> 12;
		tl_epfail_rng ^= tl_epfail_rng << 25;
		tl_epfail_rng ^= tl_epfail_rng >> 27;
		uint64_t r = tl_epfail_rng * 0x2545F4914F6CDD1DULL >> 33;
		if (r % (unsigned)g_opt.epfail == 0) {
			atomic_store(&g_ctlfail[fd], 1);
			atomic_fetch_add(&g_epfail_fails, 1);
			errno = (r >> 20) & 1 ? ENOSPC : ENOMEM;
			return -1;
		}
	}
	return __real_epoll_ctl(epfd, op, fd, ev);
}

static int g_base_fds;
static pthread_t g_wd;
static _Atomic int g_wd_stop;

double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

void seed_thread(int idx)
{
	tl_rng = g_opt.seed * 0x9E3779B97F4A7C15ULL + (uint64_t)idx * 0xBF58476D1CE4E5B9ULL + 1;
	if (!tl_rng)
		tl_rng = 1;
}

/* Raw atomic loads of the entry, not fdc_dump(): failures are also reported
 * from inside the close path, where taking a reference could block.
 */
static void print_entry(int fd)
{
	struct fdc_table *t = g_run.t;
	if (!t || fd < 0 || fd >= g_run.maxfd)
		return;
	struct fdc_entry *e = &t->fdtab[fd];
	fprintf(stderr,
	        "  fd %d: refc_tgid=%#x state=%#x gen=%u running=%#llx thread=%#llx update=%#llx"
	        " polled r=%#llx w=%#llx hup=%#llx owner=%#llx links=%#llx\n"
	        "  test record: live=%u gen=%u cookie=%#llx kind=%u\n",
	        fd, atomic_load(&e->refc_tgid), atomic_load(&e->state), atomic_load(&e->generation),
	        (unsigned long long)atomic_load(&e->running_mask),
	        (unsigned long long)atomic_load(&e->thread_mask),
	        (unsigned long long)atomic_load(&e->update_mask),
	        (unsigned long long)atomic_load(&t->polled[fd].recv),
	        (unsigned long long)atomic_load(&t->polled[fd].send),
	        (unsigned long long)atomic_load(&t->polled[fd].hup),
	        (unsigned long long)atomic_load(&e->owner),
	        (unsigned long long)atomic_load(&e->links),
	        atomic_load(&g_rec[fd].live), atomic_load(&g_rec[fd].gen),
	        (unsigned long long)atomic_load(&g_rec[fd].cookie), atomic_load(&g_rec[fd].kind));
}

void fail_at(const char *file, int line, int fd, const char *fmt, ...)
{
	static _Atomic int failing;
	va_list ap;

	/* the first failure reports, concurrent ones wait for its abort */
	if (atomic_exchange(&failing, 1))
		for (;;)
			pause();
	fprintf(stderr, "FAIL: %s:%d: [mode=%s seed=%llu] ", file, line,
	        g_opt.mode ? g_opt.mode : "?", (unsigned long long)g_opt.seed);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	print_entry(fd);
	fflush(stderr);
	abort();
}

/* The hook: CLOSE_END is the exactly-once accounting; elsewhere it widens
 * the race windows (HAProxy's trick, notes E) by yielding now and then.
 */
static void hook(void *arg, int point, int tid, int fd, uint32_t gen)
{
	(void)arg;
	if (point == FDC_HK_CLOSE_BEGIN && fd >= 0 && fd < g_run.maxfd)
		CHECKFD(fd, atomic_load(&g_inside[fd]) == 0,
		        "final close of fd %d (gen %u) begins while %d handler(s) of the test are inside",
		        fd, gen, atomic_load(&g_inside[fd]));
	if (point == FDC_HK_BEFORE_WAIT && tid >= 0 && tid < MAX_THREADS)
		atomic_store(&g_run.waiting[tid], 1);   /* entering epoll_wait */
	if (point != FDC_HK_CLOSE_END) {
		if (g_opt.widen && chance((unsigned)g_opt.widen))
			sched_yield();
		return;
	}
	CHECKFD(fd, fd >= 0 && fd < g_run.maxfd, "close hook for fd %d out of range", fd);
	CHECKFD(fd, atomic_load(&g_inside[fd]) == 0,
	        "final close of fd %d (gen %u) while %d handler(s) of the test are inside", fd, gen,
	        atomic_load(&g_inside[fd]));
	struct fdrec *r = &g_rec[fd];
	uint32_t one = 1;
	if (!atomic_compare_exchange_strong(&r->live, &one, 0))
		FAILFD(fd, "second close of fd %d (hook gen %u): incarnation not live", fd, gen);
	uint32_t want = atomic_load(&r->gen);
	/* The core passes the generation the closed incarnation had. */
	CHECKFD(fd, gen == want, "close of fd %d reports gen %u, inserted gen %u", fd, gen, want);
	CHECKFD(fd, atomic_load(&g_run.t->fdtab[fd].running_mask) == 0,
	        "final close of fd %d while a running bit is held", fd);
	/* I5: close() comes last, so the number must still be open here */
	CHECKFD(fd, fcntl(fd, F_GETFD) >= 0, "fd %d already closed before the final close: %s",
	        fd, strerror(errno));
	tl_closes++;
	atomic_fetch_add(&g_run.closes, 1);
}

int count_open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	if (!d)
		FAIL("opendir /proc/self/fd: %s", strerror(errno));
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1;   /* the directory's own fd */
}

void run_init(void)
{
	struct rlimit rl;
	int err = 0;

	SYS(getrlimit(RLIMIT_NOFILE, &rl));
	g_run.maxfd = 4096;
	if (rl.rlim_cur < (rlim_t)g_run.maxfd && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max < (rlim_t)g_run.maxfd ? rl.rlim_max : (rlim_t)g_run.maxfd;
		SYS(setrlimit(RLIMIT_NOFILE, &rl));
	}
	if (rl.rlim_cur < (rlim_t)g_run.maxfd) {
		/* numbers stay low anyway (every scenario bounds what it keeps open) */
		g_run.maxfd = (int)rl.rlim_cur;
	}
	g_rec = calloc((size_t)g_run.maxfd, sizeof(*g_rec));
	g_inside = calloc((size_t)g_run.maxfd, sizeof(*g_inside));
	g_ctlfail = calloc((size_t)g_run.maxfd, sizeof(*g_ctlfail));
	g_ctltold = calloc((size_t)g_run.maxfd, sizeof(*g_ctltold));
	CHECK(g_rec != NULL && g_inside != NULL && g_ctlfail != NULL && g_ctltold != NULL, "calloc");
	g_run.t = fdc_table_new(g_run.maxfd, g_opt.nthreads, g_opt.ngroups, &err);
	if (!g_run.t)
		FAIL("fdc_table_new(%d, %d, %d): %s", g_run.maxfd, g_opt.nthreads, g_opt.ngroups,
		     strerror(-err));
	fdc_set_hook(g_run.t, hook, NULL);
	CHECK(pthread_barrier_init(&g_run.bar, NULL, (unsigned)g_opt.nthreads) == 0, "barrier");
	for (int i = 0; i < g_opt.nthreads; i++)
		atomic_store(&g_run.busy[i], 1);
	/* after the table: its epoll and eventfds are part of the baseline */
	g_base_fds = count_open_fds();
}

void run_fini(void)
{
	uint64_t ins = atomic_load(&g_run.inserts), clo = atomic_load(&g_run.closes);

	CHECK(ins == clo, "%llu incarnations inserted but %llu closed",
	      (unsigned long long)ins, (unsigned long long)clo);
	check_quiescent(0);     /* now: every entry clean, nothing registered */
	/* ctl() repairs the benign mismatches itself: any other epoll_ctl
	 * failure means polled_mask and the kernel disagreed; those made on
	 * purpose (-e) are each counted once */
	struct fdc_counters c;
	uint64_t ctl_err = 0;
	for (int i = 0; i < g_opt.nthreads; i++) {
		fdc_counters(fdc_thread(g_run.t, i), &c);
		ctl_err += c.ctl_err;
	}
	CHECK(ctl_err == atomic_load(&g_epfail_fails), "%llu failed epoll_ctl calls, %llu made to fail",
	      (unsigned long long)ctl_err, (unsigned long long)atomic_load(&g_epfail_fails));
	int n = count_open_fds();
	CHECK(n == g_base_fds, "%d fds open at the end, %d at the start (leak or extra close)",
	      n, g_base_fds);
	fdc_table_free(g_run.t);
	g_run.t = NULL;
	pthread_barrier_destroy(&g_run.bar);
	for (int fd = 0; fd < g_run.maxfd; fd++)
		CHECKFD(fd, atomic_load(&g_inside[fd]) == 0, "test bookkeeping: handler count left");
	free(g_rec);
	g_rec = NULL;
	free(g_inside);
	g_inside = NULL;
	free((void *)g_ctlfail);
	g_ctlfail = NULL;
	free((void *)g_ctltold);
	g_ctltold = NULL;
}

uint64_t tst_insert(int fd, uint32_t kind, int tgid, uint64_t mask, uint32_t flags)
{
	struct fdc_table *t = g_run.t;
	struct fdrec *r;

	CHECK(fd >= 0 && fd < g_run.maxfd, "fd %d beyond the table (%d)", fd, g_run.maxfd);
	r = &g_rec[fd];
	/* The number came from socket()/accept(): the previous incarnation must
	 * have gone through the close hook, else the core closed it behind it.
	 */
	CHECKFD(fd, atomic_load(&r->live) == 0, "fd %d reused while its incarnation is live", fd);
	uint64_t cookie = (atomic_fetch_add(&g_run.serial, 1) + 1) << COOKIE_FDBITS | (uint64_t)fd;
	uint32_t gen = atomic_load(&t->fdtab[fd].generation);
	/* published before the insert: a poller may see the fd at once */
	atomic_store(&g_ctlfail[fd], 0);
	atomic_store(&g_ctltold[fd], 0);
	atomic_store(&r->cookie, cookie);
	atomic_store(&r->gen, gen);
	atomic_store(&r->kind, kind);
	atomic_store(&r->live, 1);
	int rc = fdc_insert(t, fd, cookie, kind, tgid, mask, flags);
	CHECKFD(fd, rc >= 0, "fdc_insert(fd %d, tgid %d, mask %#llx): %s", fd, tgid,
	        (unsigned long long)mask, strerror(-rc));
	atomic_fetch_add(&g_run.inserts, 1);

	struct fdc_fdinfo fi;
	rc = fdc_dump(t, fd, &fi);
	CHECKFD(fd, rc >= 0, "fdc_dump: %s", strerror(-rc));
	CHECKFD(fd, fi.owner == cookie && fi.generation == gen && fi.tgid == (uint32_t)tgid &&
	            fi.thread_mask == mask && fi.kind == kind,
	        "after insert: owner %#llx gen %u tgid %u mask %#llx kind %u",
	        (unsigned long long)fi.owner, fi.generation, fi.tgid,
	        (unsigned long long)fi.thread_mask, fi.kind);
	return cookie;
}

int tst_delete(struct fdc_thread *th, int fd, uint64_t cookie)
{
	struct fdrec *r = &g_rec[fd];

	/* the test deletes each incarnation once: it must still be the one */
	CHECKFD(fd, atomic_load(&r->live) && atomic_load(&r->cookie) == cookie,
	        "deleting fd %d (cookie %#llx) but that incarnation is gone", fd,
	        (unsigned long long)cookie);
	uint64_t before = tl_closes;
	int rc = fdc_delete(th, fd);
	CHECKFD(fd, rc == 0 || rc == 1, "fdc_delete(fd %d) = %d", fd, rc);
	if (rc == 1)
		CHECKFD(fd, tl_closes == before + 1, "fdc_delete returned 1 but closed %llu times",
		        (unsigned long long)(tl_closes - before));
	else {
		CHECKFD(fd, tl_closes == before, "fdc_delete returned 0 but this thread closed it");
		atomic_fetch_add(&g_run.deferred, 1);
	}
	return rc;
}

int tst_leave(struct fdc_thread *th, const struct fdc_event *ev)
{
	uint64_t before = tl_closes;
	int rc = fdc_leave(th, ev->fd, ev->gen);
	CHECKFD(ev->fd, rc == FDC_DONE || rc == FDC_CLOSED || rc == FDC_MIGRATED,
	        "fdc_leave(fd %d gen %u) = %d", ev->fd, ev->gen, rc);
	CHECKFD(ev->fd, tl_closes - before <= 1, "one leave, several closes");
	if (tl_closes != before)
		CHECKFD(ev->fd, rc == FDC_CLOSED, "fdc_leave closed fd %d but returned %d", ev->fd, rc);
	return rc;
}

/* The handler-side checks, before the handler deletes anything. */
void check_event(struct fdc_thread *th, const struct fdc_event *ev)
{
	int fd = ev->fd;
	atomic_fetch_add_explicit(&g_run.events, 1, memory_order_relaxed);
	CHECK(fd >= 0 && fd < g_run.maxfd, "event for fd %d", fd);
	struct fdrec *r = &g_rec[fd];
	/* while we hold the running bit the incarnation cannot be closed, so
	 * the number cannot have been reused: the record is still ours.
	 */
	CHECKFD(fd, (ev->owner & COOKIE_FDMASK) == (uint64_t)fd,
	        "event fd %d carries owner %#llx of another fd", fd, (unsigned long long)ev->owner);
	CHECKFD(fd, atomic_load(&r->live), "event on fd %d after its close", fd);
	CHECKFD(fd, atomic_load(&r->cookie) == ev->owner && atomic_load(&r->gen) == ev->gen,
	        "event (owner %#llx gen %u) is not the inserted incarnation", (unsigned long long)ev->owner,
	        ev->gen);
	CHECKFD(fd, ev->kind == atomic_load(&r->kind), "event kind %u", ev->kind);
	CHECKFD(fd, (ev->events & ~FDC_POLL_ANY) == 0, "event bits %#x", ev->events);

	struct fdc_fdinfo fi;
	int rc = fdc_dump(g_run.t, fd, &fi);
	CHECKFD(fd, rc >= 0, "fdc_dump in handler: %s", strerror(-rc));
	CHECKFD(fd, fi.running_mask & th->ltid_bit, "handler on tid %d without its running bit",
	        th->tid);
	/* thread_mask only changes under us through a delete (-> 0): a takeover
	 * needs running == 0 first.
	 */
	CHECKFD(fd, (fi.thread_mask & th->ltid_bit) || fi.thread_mask == 0,
	        "handler on tid %d which is not in thread_mask %#llx", th->tid,
	        (unsigned long long)fi.thread_mask);
	CHECKFD(fd, fi.generation == ev->gen && fi.owner == ev->owner && fi.tgid == (uint32_t)th->tgid,
	        "handler: entry gen %u owner %#llx tgid %u", fi.generation,
	        (unsigned long long)fi.owner, fi.tgid);
}

/* /proc/self/fdinfo/<epfd>: one "tfd: N events: X data: Y" line per
 * registration. reg[fd] = events | 1 << 32 when registered (bit 31 of the
 * events is EPOLLET: a marker there would hide it).
 */
static void read_epoll_interest(int epfd, uint64_t *reg, uint64_t *data)
{
	char path[64], line[512];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", epfd);
	FILE *f = fopen(path, "r");
	if (!f)
		FAIL("fopen %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		int tfd;
		unsigned ev;
		unsigned long long d;
		if (sscanf(line, "tfd: %d events: %x data: %llx", &tfd, &ev, &d) != 3)
			continue;
		if (tfd < 0 || tfd >= g_run.maxfd)
			FAIL("epfd %d watches fd %d beyond the table", epfd, tfd);
		reg[tfd] = ev | 1ull << 32;
		data[tfd] = d;
	}
	fclose(f);
}

uint64_t kernel_registration(int epfd, int fd, uint64_t *data)
{
	uint64_t *reg = calloc((size_t)g_run.maxfd, sizeof(*reg));
	uint64_t *dat = calloc((size_t)g_run.maxfd, sizeof(*dat));
	uint64_t r;

	CHECK(reg && dat, "calloc");
	read_epoll_interest(epfd, reg, dat);
	r = reg[fd];
	if (data)
		*data = dat[fd];
	free(reg);
	free(dat);
	return r;
}

void ctl_told(int fd)
{
	CHECKFD(fd, g_opt.epfail, "FDC_POLL_CTL with no failure made");
	atomic_store(&g_ctltold[fd], 1);
}

/* The owners (of tm) that have fd listed to make their refused
 * registration again (poller_owed.c, fail_fd). Workers are stopped. */
static uint64_t retry_add_listed(struct fdc_table *t, int fd, uint64_t tm)
{
	const struct fdc_group *g = &t->groups[atomic_load(&t->fdtab[fd].refc_tgid) & FDC_TGID_MASK];
	uint64_t listed = 0;

	for (; tm; tm &= tm - 1)
		if (fdc_thread(t, g->base + __builtin_ctzll(tm))->retry_why[fd] & FDC_RETRY_ADD)
			listed |= tm & -tm;
	return listed;
}

int ctl_report_owed(struct fdc_thread *th, int fd, uint32_t gen)
{
	if (th->retry_why[fd] & FDC_RETRY_CTL)
		return 1;
	for (int k = 0; k < th->nbowed; k++)
		if (th->owed[k].fd == fd && th->owed[k].gen == gen && (th->owed[k].events & FDC_POLL_CTL))
			return 1;
	return 0;
}

static void check_dir(int fd, const char *dir, int active, uint64_t polled, uint64_t tm,
                      int allow_stale)
{
	if (active)
		CHECKFD(fd, (polled & tm) == tm, "%s ACTIVE but some owner does not poll it (update lost)",
		        dir);
	else
		CHECKFD(fd, (polled & tm) == 0, "%s inactive but still polled by an owner", dir);
	if (!allow_stale)
		CHECKFD(fd, (polled & ~tm) == 0, "%s polled by a thread outside thread_mask", dir);
}

/* Whether an owner (tm, of fd's group) has fd listed for a retry of its
 * kept edges (poller_owed.c, retry_later). Workers are stopped: their retry
 * rings hold still. */
static int retry_listed(struct fdc_table *t, int fd, uint64_t tm)
{
	const struct fdc_group *g = &t->groups[atomic_load(&t->fdtab[fd].refc_tgid) & FDC_TGID_MASK];

	for (; tm; tm &= tm - 1)
		if (fdc_thread(t, g->base + __builtin_ctzll(tm))->retry_why[fd] & FDC_RETRY_KEPT)
			return 1;
	return 0;
}

/* Whether a thread of fd's group owes a report of fd's live incarnation
 * or has fd listed for a retry of a failed registration's report
 * (poller_owed.c: owe, retry_later). Workers are stopped: their lists hold
 * still. */
static int ctl_report_pending(struct fdc_table *t, int fd)
{
	struct fdc_entry *e = &t->fdtab[fd];
	const struct fdc_group *g = &t->groups[atomic_load(&e->refc_tgid) & FDC_TGID_MASK];
	uint32_t gen = atomic_load(&e->generation);

	for (int i = 0; i < g->count; i++)
		if (ctl_report_owed(fdc_thread(t, g->base + i), fd, gen))
			return 1;
	return 0;
}

void check_quiescent(int allow_stale)
{
	struct fdc_table *t = g_run.t;
	int maxfd = g_run.maxfd;

	for (int fd = 0; fd < maxfd; fd++) {
		struct fdc_entry *e = &t->fdtab[fd];
		uint32_t rt = atomic_load(&e->refc_tgid);
		uint32_t tgid = rt & FDC_TGID_MASK;
		uint64_t pr = atomic_load(&t->polled[fd].recv), pw = atomic_load(&t->polled[fd].send);
		uint64_t ph = atomic_load(&t->polled[fd].hup);
		uint64_t tm = atomic_load(&e->thread_mask);
		CHECKFD(fd, (rt & FDC_REF_MASK) == 0, "quiescent: reference leaked");
		CHECKFD(fd, atomic_load(&e->running_mask) == 0, "quiescent: running bit left");
		if (tgid == 0) {
			CHECKFD(fd, atomic_load(&g_rec[fd].live) == 0,
			        "inserted incarnation vanished from the table without a close");
			CHECKFD(fd, atomic_load(&e->owner) == 0 && tm == 0 && atomic_load(&e->update_mask) == 0 &&
			            atomic_load(&e->state) == 0 && pr == 0 && pw == 0 && ph == 0,
			        "closed entry not clean");
			CHECKFD(fd, fdc_in_shared_list(t, fd) == 0, "closed entry left on a shared list");
			continue;
		}
		CHECKFD(fd, tgid <= (uint32_t)t->nbgroup, "tgid");
		uint64_t enabled = t->groups[tgid].enabled_mask;
		uint32_t st = atomic_load(&e->state);
		CHECKFD(fd, atomic_load(&g_rec[fd].live) && atomic_load(&e->owner) == atomic_load(&g_rec[fd].cookie) &&
		            atomic_load(&e->generation) == atomic_load(&g_rec[fd].gen),
		        "table entry is not the incarnation the test inserted");
		CHECKFD(fd, tm != 0, "orphan left in the table: deleted but never closed");
		CHECKFD(fd, (tm & ~enabled) == 0, "thread_mask outside the group");
		CHECKFD(fd, atomic_load(&e->update_mask) == 0,
		        "update bit left after every thread's update pass");
		CHECKFD(fd, fdc_in_shared_list(t, fd) == 0, "still on the shared update list");
		CHECKFD(fd, (st & FDC_MUST_CLOSE) == 0, "MUST_CLOSE set on a live fd");
		if (st & FDC_EDGE) {
			/* a group-shared connection's registration is made once
			 * and only grows (poller.c): EPOLLIN in every owner's
			 * poller whatever is wanted, EPOLLOUT in every owner's
			 * while send is wanted (each passed since), in some
			 * (the inserter's at least, unless it left) when not */
			/* (a registration made to fail: -e, common.h) */
			int failed = atomic_load(&g_ctlfail[fd]);
			CHECKFD(fd, failed || (pr & tm) == tm, "EDGE: an owner does not poll recv");
			if ((st & FDC_ACTIVE_W) && !failed)
				CHECKFD(fd, (pw & tm) == tm,
				        "EDGE: send ACTIVE but some owner does not poll it (update lost)");
			if (!allow_stale)
				CHECKFD(fd, ((pr | pw) & ~tm) == 0, "EDGE: polled outside thread_mask");
			/* a kept edge is taken by the verb that activates its
			 * direction, or by an owner's pass: never left beside it,
			 * unless its report found no memory and an owner has it
			 * listed for a retry (-m; poller_owed.c, retry_later) */
			CHECKFD(fd, (!((st & FDC_KEPT_R) && (st & FDC_ACTIVE_R)) &&
			             !((st & FDC_KEPT_W) && (st & FDC_ACTIVE_W))) ||
			            retry_listed(t, fd, tm),
			        "EDGE: an edge kept on an ACTIVE direction (replay lost): state %#x", st);
		} else {
			/* recv-side registration: ACTIVE_R, or a hang-up watch (WATCH_HUP) */
			/* a failed registration, reported (FDC_POLL_CTL): its
			 * poller polls nothing for it until its owner acts (a
			 * connection's closes it), or, a listener's (EXCLUSIVE),
			 * until its thread makes it again: listed for that */
			if (!(st & FDC_POLL_CTL)) {
				check_dir(fd, "recv", !!(st & (FDC_ACTIVE_R | FDC_WATCH_HUP)), pr, tm,
				          allow_stale);
				check_dir(fd, "send", !!(st & FDC_ACTIVE_W), pw, tm, allow_stale);
			} else if ((st & FDC_EXCLUSIVE) && (st & FDC_ACTIVE_R)) {
				CHECKFD(fd, ((pr | retry_add_listed(t, fd, tm)) & tm) == tm,
				        "listener ACTIVE, an owner's refused registration neither made"
				        " again nor listed for it (polled %#llx)", (unsigned long long)pr);
			}
		}
		/* a failed registration is reported to an owner (I8): told to a
		 * handler (which deletes a connection at once), owed, or listed
		 * for a retry by a thread of the group */
		if (st & FDC_POLL_CTL)
			CHECKFD(fd, atomic_load(&g_ctltold[fd]) || ctl_report_pending(t, fd),
			        "failed registration (ctl_errno %d) never reported: no thread owes"
			        " or lists its report", atomic_load(&e->ctl_errno));
		/* and of the recv-side kind: a hang-up watch alone iff WATCH_HUP
		 * without ACTIVE_R (never on an exclusive fd) */
		check_dir(fd, "hang-up watch alone",
		          (st & FDC_WATCH_HUP) && !(st & (FDC_ACTIVE_R | FDC_EXCLUSIVE)), ph, tm,
		          allow_stale);
	}

	/* the kernel's view must match polled_mask, thread by thread (T4) */
	uint64_t *reg = malloc(sizeof(*reg) * (size_t)maxfd);
	uint64_t *data = malloc(sizeof(*data) * (size_t)maxfd);
	CHECK(reg && data, "malloc");
	for (int tid = 0; tid < t->nbthread; tid++) {
		struct fdc_thread *th = fdc_thread(t, tid);
		int tgid, ltid, epfd;
		fdc_thread_info(th, &tgid, &ltid, &epfd);
		memset(reg, 0, sizeof(*reg) * (size_t)maxfd);
		read_epoll_interest(epfd, reg, data);
		for (int fd = 0; fd < maxfd; fd++) {
			if (fd == th->evfd)
				continue;
			struct fdc_entry *e = &t->fdtab[fd];
			uint32_t tgid = atomic_load(&e->refc_tgid) & FDC_TGID_MASK;
			int mine = tgid == (uint32_t)th->tgid;
			int pr = mine && (atomic_load(&t->polled[fd].recv) & th->ltid_bit);
			int pw = mine && (atomic_load(&t->polled[fd].send) & th->ltid_bit);
			int ph = mine && (atomic_load(&t->polled[fd].hup) & th->ltid_bit);
			int r = !!reg[fd];
			CHECKFD(fd, !ph || pr, "tid %d: hang-up watch bit without the recv bit", tid);
			CHECKFD(fd, r == (pr || pw),
			        "tid %d: kernel registration %s but polled bits r=%d w=%d (events %#x)",
			        tid, r ? "present" : "absent", pr, pw, (uint32_t)reg[fd]);
			if (!r)
				continue;
			/* a recv-side registration without EPOLLIN: a hang-up watch
			 * alone (WATCH_HUP with ACTIVE_R off), EPOLLRDHUP kept */
			uint32_t st = atomic_load(&e->state);
			int in = pr && ((st & FDC_ACTIVE_R) || !(st & FDC_WATCH_HUP));
			CHECKFD(fd, !!(reg[fd] & EPOLLIN) == in && !!(reg[fd] & EPOLLOUT) == pw &&
			        (!pr || (st & FDC_EXCLUSIVE) || (reg[fd] & EPOLLRDHUP)),
			        "tid %d: kernel events %#x vs polled r=%d w=%d", tid, (uint32_t)reg[fd],
			        pr, pw);
			/* and polled_mask's own record of the kind: EPOLLIN iff recv
			 * polled and not as a hang-up watch alone */
			CHECKFD(fd, !!(reg[fd] & EPOLLIN) == (pr && !ph),
			        "tid %d: kernel events %#x vs polled r=%d hup=%d", tid,
			        (uint32_t)reg[fd], pr, ph);
			/* the registration's kind: exclusive iff EXCLUSIVE, and
			 * edge-triggered iff a group-shared connection (FDC_EDGE:
			 * fdc_insert_shared, then every update pass's DEL + ADD) */
			CHECKFD(fd, !!(reg[fd] & EPOLLEXCLUSIVE) == !!(st & FDC_EXCLUSIVE) &&
			            !!(reg[fd] & EPOLLET) == !!(st & FDC_EDGE),
			        "tid %d: kernel events %#x for state %#x (EPOLLEXCLUSIVE iff EXCLUSIVE,"
			        " EPOLLET iff EDGE)", tid, (uint32_t)reg[fd], st);
			uint64_t want = (uint64_t)atomic_load(&e->generation) << 32 | (uint32_t)fd;
			CHECKFD(fd, data[fd] == want, "tid %d: epoll data %#llx, want %#llx", tid,
			        (unsigned long long)data[fd], (unsigned long long)want);
		}
	}
	free(reg);
	free(data);
}

void quiescent_point(struct fdc_thread *th, int allow_stale)
{
	bar_wait(th->tid);
	fdc_update_pass(th);
	bar_wait(th->tid);
	if (th->tid == 0)
		check_quiescent(allow_stale);
	bar_wait(th->tid);
}

void bar_wait(int tid)
{
	atomic_store(&g_run.busy[tid], 0);
	int rc = pthread_barrier_wait(&g_run.bar);
	CHECK(rc == 0 || rc == PTHREAD_BARRIER_SERIAL_THREAD, "barrier: %d", rc);
	atomic_store(&g_run.busy[tid], 1);
	tick(tid);
}

/* Chaos: verbs and enter/leave on fd numbers the caller knows nothing about
 * (closed, someone else's, being closed right now, or not in the table).
 * Legal API use: the core must answer -EBADF or act on whatever incarnation
 * is there. What it stresses is the reference protocol: a verb holding a
 * reference while the final close runs must be waited for, or its update
 * lands on a clean entry (HAProxy 237e6a0d6). It never stops a direction
 * (a stopped connection would never see its EOF) and never deletes.
 */
static void chaos(struct fdc_thread *th)
{
	static int (*const verbs[])(struct fdc_thread *, int) = {
		fdc_want_recv, fdc_want_send, fdc_may_recv, fdc_cant_recv, fdc_may_send, fdc_cant_send,
	};
	int fd = (int)rndn(64);
	if (chance(4)) {
		uint32_t gen;
		int rc = fdc_enter(th, fd, &gen);
		CHECK(rc == FDC_DONE || rc == FDC_CLOSED || rc == FDC_MIGRATED, "fdc_enter = %d", rc);
		if (rc != FDC_DONE)
			return;
		if (chance(4))
			sched_yield();   /* a close becomes deferred to us */
		struct fdc_event ev = { .fd = fd, .gen = gen };
		tst_leave(th, &ev);
		return;
	}
	int rc = verbs[rndn(sizeof(verbs) / sizeof(verbs[0]))](th, fd);
	CHECK(rc == 0 || rc == -EBADF, "verb on fd %d: %d", fd, rc);
}

int worker_continue(struct fdc_thread *th, int allow_stale)
{
	int tid = th->tid;
	static _Thread_local int seen;

	tick(tid);
	atomic_fetch_add_explicit(&g_run.iters_done[tid], 1, memory_order_relaxed);
	if (g_opt.chaos && chance((unsigned)g_opt.chaos))
		chaos(th);
	/* main never sets stop while a quiescent point is pending, so every
	 * worker takes the same sequence of barriers */
	int req = atomic_load(&g_run.pause_req);
	if (req != seen) {
		seen = req;
		quiescent_point(th, allow_stale);
		atomic_fetch_add(&g_run.pause_ack, 1);
	}
	return !atomic_load_explicit(&g_run.stop, memory_order_relaxed);
}

/* The shared update lists: head, tail, and every entry whose links say it
 * is in a list or locked (links word as in fd-t.h: low half next, high prev).
 */
static void dump_lists(void)
{
	struct fdc_table *t = g_run.t;

	for (int g = 1; g <= t->nbgroup; g++)
		fprintf(stderr, "  group %d list: first %d last %d\n", g, atomic_load(&t->groups[g].first),
		        atomic_load(&t->groups[g].last));
	for (int fd = 0; fd < g_run.maxfd; fd++) {
		uint64_t l = atomic_load(&t->fdtab[fd].links);
		int32_t next = (int32_t)(uint32_t)l, prev = (int32_t)(uint32_t)(l >> 32);
		if (next >= FDC_LIST_LOCKED)
			fprintf(stderr, "  fd %d links: next %d prev %d (tgid %u)\n", fd, next, prev,
			        atomic_load(&t->fdtab[fd].refc_tgid) & FDC_TGID_MASK);
	}
}

/* With FDC_STRESS_GDB=1, every thread's stack (gdb attaches to us). */
static void dump_stacks(void)
{
	char cmd[160];
	const char *env = getenv("FDC_STRESS_GDB");

	if (!env || strcmp(env, "1"))
		return;
	snprintf(cmd, sizeof(cmd),
	         "timeout 60 gdb -p %d -batch -ex 'thread apply all bt' 1>&2 2>/dev/null", (int)getpid());
	fflush(stderr);
	if (system(cmd) != 0)
		fprintf(stderr, "(gdb failed)\n");
}

/* Aborts when a busy worker's progress counter stays still: a deadlock
 * (seed 002) or a livelock (A.13 R7) turns into a failure, not a hang.
 */
static void *watchdog(void *arg)
{
	(void)arg;
	uint64_t last[MAX_THREADS] = {0};
	double since[MAX_THREADS];
	double t0 = now_s();
	for (int i = 0; i < MAX_THREADS; i++)
		since[i] = t0;
	while (!atomic_load(&g_wd_stop)) {
		usleep(100 * 1000);
		double now = now_s();
		for (int i = 0; i < g_opt.nthreads; i++) {
			uint64_t p = atomic_load(&g_run.progress[i]);
			if (p != last[i] || !atomic_load(&g_run.busy[i])) {
				last[i] = p;
				since[i] = now;
			} else if (now - since[i] > g_opt.watchdog) {
				fprintf(stderr, "FAIL: watchdog: thread %d stuck for %.1fs (progress %llu)\n", i,
				        now - since[i], (unsigned long long)p);
				for (int fd = 0; fd < g_run.maxfd; fd++)
					if (atomic_load(&g_run.t->fdtab[fd].running_mask))
						print_entry(fd);
				dump_lists();
				dump_stacks();
				fflush(stderr);
				abort();
			}
		}
	}
	return NULL;
}

void watchdog_start(void)
{
	atomic_store(&g_wd_stop, 0);
	CHECK(pthread_create(&g_wd, NULL, watchdog, NULL) == 0, "pthread_create");
}

void watchdog_stop(void)
{
	atomic_store(&g_wd_stop, 1);
	CHECK(pthread_join(g_wd, NULL) == 0, "pthread_join");
}

void print_counters(const char *mode, double elapsed, const char *extra)
{
	/* struct fdc_counters is FDC_NCOUNTERS uint64_t in a row (fdc_counters
	 * fills it the same way): sum it as an array */
	uint64_t sum[FDC_NCOUNTERS] = {0};
	struct fdc_counters s, c;
	for (int i = 0; i < g_opt.nthreads; i++) {
		fdc_counters(fdc_thread(g_run.t, i), &c);
		const uint64_t *v = (const uint64_t *)&c;
		for (int k = 0; k < FDC_NCOUNTERS; k++)
			sum[k] += v[k];
	}
	memcpy(&s, sum, sizeof(s));
	printf("SUMMARY mode=%s seed=%llu threads=%d groups=%d elapsed=%.2fs inserts=%llu closes=%llu"
	       " events=%llu deferred=%llu loops=%llu poll_io=%llu drop=%llu skip=%llu stale=%llu"
	       " takeover=%llu accepted=%llu accept_empty=%llu wakeups=%llu ctl=%llu/%llu/%llu"
	       " ctl_err=%llu %s\n",
	       mode, (unsigned long long)g_opt.seed, g_opt.nthreads, g_opt.ngroups, elapsed,
	       (unsigned long long)g_run.inserts, (unsigned long long)g_run.closes,
	       (unsigned long long)g_run.events, (unsigned long long)g_run.deferred,
	       (unsigned long long)s.loops, (unsigned long long)s.poll_io,
	       (unsigned long long)s.poll_drop_fd, (unsigned long long)s.poll_skip_fd,
	       (unsigned long long)s.poll_stale, (unsigned long long)s.fd_takeover,
	       (unsigned long long)s.accepted, (unsigned long long)s.accept_empty,
	       (unsigned long long)s.wakeups, (unsigned long long)s.ctl_add,
	       (unsigned long long)s.ctl_mod, (unsigned long long)s.ctl_del,
	       (unsigned long long)s.ctl_err, extra ? extra : "");
	fflush(stdout);
}

int checked_takeover(struct fdc_thread *th, int fd, uint64_t cookie, _Atomic uint64_t *closed)
{
	uint64_t before = tl_closes;
	int rc = fdc_takeover(th, fd, cookie);

	if (tl_closes != before) {
		CHECKFD(fd, rc == -ESTALE && tl_closes == before + 1,
		        "fdc_takeover closed the fd but returned %d", rc);
		atomic_fetch_add(closed, 1);
	}
	return rc;
}
