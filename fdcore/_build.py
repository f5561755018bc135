"""cffi builder for sockherd.fdcore._fdcore (out-of-line API mode).

setup.py names this file in cffi_modules. The C sources are compiled as they
are; the cdef below mirrors fd.h by hand (cffi cannot parse the atomics of
fd-t.h, so the table and thread structs stay opaque to Python). In API mode
cffi releases the GIL around every call, which is what lets fdc_poll sleep in
epoll_wait while other Python threads run.
"""
from cffi import FFI

# setuptools wants paths relative to setup.py, with forward slashes.
HERE = "fdcore"
SOURCES = ["fd_table.c", "fd.c", "fd_verbs.c", "updlist.c", "poller.c", "poller_update.c", "poller_owed.c", "poller_accept.c"]
HEADERS = ["fd-t.h", "fd.h", "fd-int.h", "poller-int.h"]

CDEF = """
#define FDC_ACTIVE_R ...
#define FDC_READY_R ...
#define FDC_SHUT_R ...
#define FDC_ACTIVE_W ...
#define FDC_READY_W ...
#define FDC_SHUT_W ...
#define FDC_ERR ...
#define FDC_WATCH_HUP ...
#define FDC_POLL_IN ...
#define FDC_POLL_PRI ...
#define FDC_POLL_OUT ...
#define FDC_POLL_ERR ...
#define FDC_POLL_HUP ...
#define FDC_POLL_RDHUP ...
#define FDC_POLL_CTL ...
#define FDC_LINGER_RISK ...
#define FDC_CLONED ...
#define FDC_EXCLUSIVE ...
#define FDC_EDGE ...
#define FDC_KEPT_R ...
#define FDC_KEPT_W ...
#define FDC_SOLE ...
#define FDC_ACCEPTED ...
#define FDC_DISOWN ...
#define FDC_MUST_CLOSE ...
#define FDC_MAX_GROUPS ...
#define FDC_MAX_GROUP_THREADS ...
#define FDC_EVBATCH ...

enum fdc_outcome { FDC_DONE, FDC_CLOSED, FDC_MIGRATED };
enum fdc_hook_point {
    FDC_HK_ENTER_RUNNING, FDC_HK_ENTER_RETRY, FDC_HK_LEAVE, FDC_HK_TAKEOVER_OWNED,
    FDC_HK_DELETE_ORPHANED, FDC_HK_UPDATE_CONSUMED, FDC_HK_CLOSE_BEGIN,
    FDC_HK_CLOSE_DRAINED, FDC_HK_CLOSE_END, FDC_HK_BEFORE_WAIT,
    FDC_HK_RELEASE_CLEARED, FDC_HK_WALK_ARRIVE, FDC_HK_LIST_UNLINK, FDC_HK_ENTER_OWNER,
};

struct fdc_table;
struct fdc_thread;

struct fdc_event {
    int32_t fd;
    uint32_t events;
    uint32_t gen;
    uint32_t kind;
    uint64_t owner;
};

struct fdc_fdinfo {
    int32_t fd;
    uint32_t tgid;
    uint32_t refcount;
    uint32_t state;
    uint32_t generation;
    uint32_t nb_takeover;
    uint32_t kind;
    int32_t in_shared_list;
    uint64_t running_mask;
    uint64_t thread_mask;
    uint64_t update_mask;
    uint64_t polled_recv;
    uint64_t polled_send;
    uint64_t polled_hup;
    uint64_t owner;
    int32_t ctl_errno;
    uint32_t _pad;
};

struct fdc_counters {
    uint64_t loops, poll_io, poll_drop_fd, poll_skip_fd, poll_stale, fd_takeover,
             accepted, accept_empty, wake_nowork, wakeups,
             ctl_add, ctl_mod, ctl_del, ctl_err;
};

typedef void (*fdc_hook_fn)(void *arg, int point, int tid, int fd, uint32_t gen);
extern "Python" void _fdc_py_hook(void *arg, int point, int tid, int fd, uint32_t gen);

const char *fdc_version(void);
struct fdc_table *fdc_table_new(int maxfd, int nbthread, int nbgroup, int *err);
void fdc_table_free(struct fdc_table *t);
struct fdc_thread *fdc_thread(struct fdc_table *t, int tid);
void fdc_thread_info(const struct fdc_thread *th, int *tgid, int *ltid, int *epfd);
void fdc_set_hook(struct fdc_table *t, fdc_hook_fn fn, void *arg);

int fdc_insert(struct fdc_table *t, int fd, uint64_t owner, uint32_t kind,
               int tgid, uint64_t thread_mask, uint32_t flags);
int fdc_delete(struct fdc_thread *th, int fd);
int fdc_released(struct fdc_table *t, int fd, uint32_t gen);
int fdc_takeover(struct fdc_thread *th, int fd, uint64_t expected_owner);
int fdc_enter(struct fdc_thread *th, int fd, uint32_t *gen);
int fdc_leave(struct fdc_thread *th, int fd, uint32_t gen);

int fdc_want_recv(struct fdc_thread *th, int fd);
int fdc_stop_recv(struct fdc_thread *th, int fd);
int fdc_want_send(struct fdc_thread *th, int fd);
int fdc_stop_send(struct fdc_thread *th, int fd);
int fdc_want_hup(struct fdc_thread *th, int fd);
int fdc_stop_hup(struct fdc_thread *th, int fd);
int fdc_may_recv(struct fdc_thread *th, int fd);
int fdc_cant_recv(struct fdc_thread *th, int fd);
int fdc_may_send(struct fdc_thread *th, int fd);
int fdc_cant_send(struct fdc_thread *th, int fd);

int fdc_listener_fds(struct fdc_table *t, int fd, uint64_t tgids, int *out);
int fdc_dump(struct fdc_table *t, int fd, struct fdc_fdinfo *out);
int fdc_in_shared_list(struct fdc_table *t, int fd);

int fdc_update_pass(struct fdc_thread *th);
int fdc_poll(struct fdc_thread *th, int timeout_ms, struct fdc_event *out, int max);
int fdc_leave_batch(struct fdc_thread *th, const struct fdc_event *ev, int n);
int fdc_wake(struct fdc_table *t, int tid);
int fdc_accept(struct fdc_thread *th, int lfd, int *out, int max);
int fdc_requeue(struct fdc_thread *th, int fd);
int fdc_insert_shared(struct fdc_thread *th, int fd, uint64_t owner, uint32_t kind,
                      uint64_t thread_mask);
void fdc_counters(const struct fdc_thread *th, struct fdc_counters *out);
"""

ffibuilder = FFI()
ffibuilder.cdef(CDEF)
ffibuilder.set_source(
    "sockherd.fdcore._fdcore",
    '#include "fd.h"',
    sources=[f"{HERE}/{s}" for s in SOURCES],
    depends=[f"{HERE}/{h}" for h in HEADERS],
    include_dirs=[HERE],
    extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
