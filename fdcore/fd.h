/* sockherd fdcore: operations on the fd table and the per-thread pollers.
 *
 * Conventions: functions return >= 0 on success and a negative errno on
 * failure (the Python wrapper turns those into OSError in one place). A
 * `struct fdc_thread *th` argument is the calling thread's own context: the
 * caller must be the one OS thread currently using that context.
 *
 * The invariants every function below keeps (numbers used in comments):
 *  I1 the tgid changes only while the refcount is 0; masks are read or
 *     written only under a tgid reference matching the caller's group, or
 *     while holding a running bit.
 *  I2 insert requires a clean entry (refcount 0, state 0, owner 0).
 *  I3 a running bit is only kept by a thread whose bit is in thread_mask;
 *     running bits outside thread_mask mean a takeover/delete in progress.
 *  I4 exactly one thread performs the final close of an incarnation:
 *     one that, after the fd was orphaned (thread_mask 0), reads a zero
 *     running_mask and wins the one-shot FDC_MUST_CLOSE token. That is a
 *     runner leaving (its clear, then the read), or a deleter of another
 *     group (no running bit; its orphaning, then the read).
 *  I5 close() is the very last step: the number may be reused the instant
 *     it returns, so the entry is clean before.
 *  I6 an update bit set in update_mask is always consumable (the fd is or
 *     will be on that thread's local list or its group's shared list), and
 *     nobody clears a bit it did not consume.
 *  I7 only the owning thread ADDs/MODs its epoll instance; another thread
 *     DELs from it only in the final close of a CLONED or DISOWN fd.
 *  I8 each owner's update pass converges its own registration to the
 *     desired state (ACTIVE bits, thread_mask) before it sleeps: ADD, MOD,
 *     DEL; polled_mask says what the kernel has. For an FDC_EDGE fd (a
 *     group-shared connection) the desired registration is the one made
 *     once, grown by EPOLLOUT, never narrowed while th owns it (poller.c):
 *     reports of directions not ACTIVE are kept (FDC_KEPT_*), and the
 *     verb that activates the direction replays them. A registration the kernel
 *     refuses is reported to the fd's owner (FDC_POLL_CTL), never left
 *     looking done (poller_update.c, ctl()). The one exception: with no memory
 *     left for the report list, the failure stays on the fd (FDC_ERR,
 *     ctl_errno) and in ctl_err, without a report.
 *  I9 an fd number carries one tgid: a listener shared by several groups
 *     gets one dup'ed number per group, and every dup'ed, inherited, passed
 *     or listening fd is CLONED.
 * Comments cite these as I1..I9; DESIGN.md section 4 states the same rules
 * in prose, with its own numbers.
 */
#ifndef SOCKHERD_FD_H
#define SOCKHERD_FD_H

#include "fd-t.h"

/* results of enter / leave */
enum fdc_outcome {
	FDC_DONE = 0,      /* entered (enter) / left normally (leave) */
	FDC_CLOSED = 1,    /* fd closed: dropped (enter) / we closed it (leave) */
	FDC_MIGRATED = 2,  /* our bit is no longer in thread_mask */
};

/* One event handed to the caller by fdc_poll(): the thread holds a running
 * bit on fd and must call fdc_leave(th, fd, gen) after handling it.
 */
struct fdc_event {
	int32_t fd;
	uint32_t events;      /* FDC_POLL_* bits of this report */
	uint32_t gen;         /* incarnation the report is about */
	uint32_t kind;
	uint64_t owner;
};

/* Snapshot of one entry, for `show fd` and tests. */
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
	uint64_t polled_hup;     /* polled_recv bits that are a hang-up watch alone */
	uint64_t owner;
	int32_t ctl_errno;    /* last failed epoll_ctl of this incarnation, 0 if none */
	uint32_t _pad;
};

const char *fdc_version(void);

/* ---- table and threads (fd_table.c) ---- */

/* Creates a table for fds 0 .. maxfd-1 and nbthread thread contexts split
 * over nbgroup groups (the first groups take the remainder; at most 64
 * threads a group), each with its own epoll instance and wake-up eventfd.
 * Returns NULL with *err = -errno on failure. Single-threaded use only.
 */
struct fdc_table *fdc_table_new(int maxfd, int nbthread, int nbgroup, int *err);

/* Frees the table, closing the pollers' epoll and eventfds. fds still in the
 * table are left open (their owners decide). No thread may use it any more.
 */
void fdc_table_free(struct fdc_table *t);

struct fdc_thread *fdc_thread(struct fdc_table *t, int tid);
/* th's group, local thread id and epoll fd (for show/tests). */
void fdc_thread_info(const struct fdc_thread *th, int *tgid, int *ltid, int *epfd);
void fdc_set_hook(struct fdc_table *t, fdc_hook_fn fn, void *arg);

/* ---- fd lifecycle (insert, listeners, inspection: fd_table.c; delete,
 * takeover, enter/leave: fd.c; the direction verbs: fd_verbs.c) ---- */

/* Registers an open fd owned by `owner` (non-zero cookie) for the threads of
 * `thread_mask` (local bits) in group `tgid`. flags: FDC_INSERT_FLAGS.
 * Any thread; the fd must not be in the table (I2: -EEXIST otherwise).
 * The fd starts READY both ways and ACTIVE in none: call want_*.
 * Refused: a number that is not open (-EBADF), a file epoll cannot poll
 * (-EPERM: regular file, directory, /dev/null, an O_PATH fd, an epoll fd
 * asked EXCLUSIVE), LINGER_RISK
 * on a DISOWN or CLONED fd (-EINVAL: the reset would hit another holder).
 * A listening socket is always inserted CLONED (I9) unless flags has
 * FDC_SOLE (the caller states nobody else holds it). FDC_ACCEPTED skips
 * these checks for an fd fdc_accept just returned (a connected socket).
 * DISOWN: the final close forgets the fd instead of closing it; the caller
 * keeps it, and must neither close it nor let its number be reused until
 * the table is done with it, since the final close still DELs the number
 * from the pollers: see fdc_delete and fdc_released.
 */
int fdc_insert(struct fdc_table *t, int fd, uint64_t owner, uint32_t kind,
               int tgid, uint64_t thread_mask, uint32_t flags);

/* A connection th just accepted, shared by the threads of thread_mask (th's
 * group; th's own bit must be in it, -EINVAL otherwise): inserted as
 * fdc_insert(FDC_ACCEPTED) would, reading, and registered EPOLLIN |
 * EPOLLEXCLUSIVE | EPOLLET in the poller of every thread of the mask, th's
 * own first and with EPOLLOUT besides. The kernel then offers each new arrival to the first of those
 * pollers that has a thread asleep in it, and to no other: the thread that
 * accepted it while it waits, else one idle sibling (worker/native: per-
 * request dispatch, DESIGN.md section 5). Edge-triggered, so a thread that
 * gets a report for a connection another thread is handling is not woken
 * again and again while that one works: the caller must read until a short
 * read (the kernel queues a new report for every arrival after it), and
 * decide among the threads which one handles a report (running bits do not
 * exclude: several threads may be inside a shared fd). Direction changes
 * (want_send ...) re-register nothing and wake nobody: th's registration
 * stays first in the file's wait queue for the connection's life (the
 * affinity); a sibling adds EPOLLOUT (DEL + ADD of its own, once) at its
 * first update pass while send is wanted. A report of a direction that is
 * not ACTIVE is not handed out but kept, and replayed to the owner whose
 * want_* activates it again (at its next fdc_poll, before it waits): a
 * flush that saw EAGAIN, then the writable edge consumed before its
 * want_send, still gets its POLL_OUT. A want_* by a thread that is no
 * owner leaves the replay to the owners' update passes and wakes them.
 * I7's one exception: the registrations are made here, by th, in the other
 * threads' instances, after the entry is published and before anything
 * else can name it (it is on no update list), polled bits first as in an
 * update pass (FDC_INSERTING meanwhile keeps every update pass off the fd, and
 * a verb that came during the registration is programmed again at its end:
 * the issue-21 review's insert race); a sibling's ADD the kernel refuses leaves that sibling
 * without it (counted ctl_err), th's own is reported to th (FDC_POLL_CTL).
 * Returns 0 or fdc_insert's -errno (fd then not in the table, not closed).
 * Threads: th's own.
 */
int fdc_insert_shared(struct fdc_thread *th, int fd, uint64_t owner, uint32_t kind,
                      uint64_t thread_mask);

/* Deletes fd and closes it, never waiting for other threads: if another
 * thread still holds a running bit, the last one to leave closes (I4).
 * Returns 1 if closed now, 0 if deferred, -EBADF if not in the table.
 * Any thread, including one of another group.
 * For a DISOWN fd "closed" means forgotten: on 1 the owner has its fd back
 * at once; on 0 only once fdc_released(t, fd, gen) says so, gen being the
 * incarnation's generation read (fdc_dump) before the delete.
 */
int fdc_delete(struct fdc_thread *th, int fd);

/* Whether incarnation `gen` of fd is over: 1 once its final close has
 * cleaned the entry (and, for a CLONED or DISOWN fd, DEL'ed it from every
 * poller that had it), 0 while it is still in the table, -EBADF if fd is
 * out of the table's range. For a DISOWN fd, 1 means the table will not
 * touch the number again: the owner may close or reuse it. For any other
 * fd, 1 may come an instant before the table's own close() of it. Any
 * thread, lock-free: one seq_cst load of the generation, which the final
 * close bumps after its last use of the number but its close().
 */
int fdc_released(struct fdc_table *t, int fd, uint32_t gen);

/* Takes an idle fd of th's group for th alone: owner must equal
 * expected_owner (-ESTALE), no thread may be inside it (-EBUSY), and th
 * must not be one owner among several (-EINVAL: a co-owner's running bit
 * would look like an ordinary runner's), nor may the fd be a group-shared
 * connection (FDC_EDGE, fdc_insert_shared: -EINVAL; an old owner asleep
 * would swallow the next arrival, which no report repeats). On success thread_mask = own bit
 * and recv is stopped (the new owner re-arms it), while a send still wanted
 * is registered by th's poller; the old owner's poller drops its
 * registration when it next sees the fd. Taking an fd th already owns
 * alone is a takeover too (counted, recv stopped), as in HAProxy.
 */
int fdc_takeover(struct fdc_thread *th, int fd, uint64_t expected_owner);

/* The two halves around a handler. enter: take a running bit for th on fd,
 * or report why not (FDC_CLOSED: not ours / closed; FDC_MIGRATED: th is no
 * longer an owner, a DEL is programmed). On FDC_DONE *gen receives the
 * incarnation held. leave: drop it; FDC_CLOSED if this call performed the
 * deferred close (or the incarnation was already gone).
 */
int fdc_enter(struct fdc_thread *th, int fd, uint32_t *gen);
int fdc_leave(struct fdc_thread *th, int fd, uint32_t gen);

/* Direction verbs. want/stop flip ACTIVE and program a poller update when
 * it changes; may/cant flip READY (no update: polled == active). Any thread
 * of any group; -EBADF if the fd is not in the table. On an FDC_EDGE fd a
 * want_* by one of its owners may owe the caller a replayed report (fd-t.h,
 * FDC_KEPT_*), made by the caller's next fdc_poll, and a change programs an
 * update only when an owner lacks a registration it needs.
 */
int fdc_want_recv(struct fdc_thread *th, int fd);
int fdc_stop_recv(struct fdc_thread *th, int fd);
int fdc_want_send(struct fdc_thread *th, int fd);
int fdc_stop_send(struct fdc_thread *th, int fd);
/* want_hup/stop_hup flip WATCH_HUP (fd-t.h): hang-ups and errors reported
 * while ACTIVE_R is off. A connection's, never an EXCLUSIVE fd's. */
int fdc_want_hup(struct fdc_thread *th, int fd);
int fdc_stop_hup(struct fdc_thread *th, int fd);
int fdc_may_recv(struct fdc_thread *th, int fd);
int fdc_cant_recv(struct fdc_thread *th, int fd);
int fdc_may_send(struct fdc_thread *th, int fd);
int fdc_cant_send(struct fdc_thread *th, int fd);

/* Gives a listener one fd number per group in `tgids` (bit g = group g):
 * the original for the lowest group, F_DUPFD_CLOEXEC copies for the others
 * (an fd number carries one tgid). out[g] receives the fd of group g, -1
 * for groups not asked. All of them must be inserted with FDC_CLONED.
 */
int fdc_listener_fds(struct fdc_table *t, int fd, uint64_t tgids, int *out);

int fdc_dump(struct fdc_table *t, int fd, struct fdc_fdinfo *out);
/* Whether fd is on its group's shared update list (tests, show fd). */
int fdc_in_shared_list(struct fdc_table *t, int fd);

/* ---- poller (poller.c, poller_update.c, poller_accept.c) ---- */

/* Applies th's pending updates (local list, then the group's shared list)
 * to its own epoll instance, after retrying the reports th could not queue
 * for want of memory and the listeners' registrations the kernel refused
 * (poller_update.c, retry_owed). Returns the number of epoll_ctl calls.
 */
int fdc_update_pass(struct fdc_thread *th);

/* One loop turn: update pass, epoll_wait(timeout_ms) (the Python wrapper
 * calls it with the GIL released), then the enter step for each report.
 * Returns how many events were written to out (th holds each), or -errno.
 * An fd whose registration th's pass could not make (I8) is reported first,
 * with FDC_POLL_ERR | FDC_POLL_CTL (errno in fdc_dump's ctl_errno), as are
 * the kept edges th's verbs or pass took (FDC_EDGE fds), and the wait does
 * not block while such a report is pending: its owner must close
 * it or change what it wants. Every failed attempt of th is reported (one
 * pending report per fd and thread); a report th can no longer make (fd
 * closed, or taken over by another thread, whose poller tries its own
 * registration) is dropped. A round whose reports were all edges kept
 * for directions nobody wants (an FDC_EDGE fd's) returns nothing to the
 * caller: the wait goes on for what is left of timeout_ms, unless a
 * wake-up (fdc_wake) came in that round too: then it returns (0 events).
 * A report that found no memory is never dropped: it is retried by th's
 * later passes, and meanwhile each wait lasts no longer than a back-off
 * (1 ms doubling to 128 ms) before a pass tries again, within the
 * caller's timeout_ms, which such rounds do not end early.
 */
int fdc_poll(struct fdc_thread *th, int timeout_ms, struct fdc_event *out, int max);

/* Leaves every event of a batch returned by fdc_poll (after the handlers
 * ran). An event already left individually is skipped harmlessly (leave
 * finds no running bit of ours). Returns how many leaves said FDC_CLOSED:
 * closed by this call, or no longer held (left or closed already).
 */
int fdc_leave_batch(struct fdc_thread *th, const struct fdc_event *ev, int n);

/* Wakes thread tid out of epoll_wait (any thread). */
int fdc_wake(struct fdc_table *t, int tid);

/* Accepts up to max connections on listener lfd (non-blocking, CLOEXEC) into
 * out. Counts accepted; an EAGAIN on the first try counts accept_empty and
 * clears READY_R. Returns the count, or -errno if the first accept failed
 * with something else than EAGAIN.
 */
int fdc_accept(struct fdc_thread *th, int lfd, int *out, int max);

/* Moves th's own registration of an exclusive fd it holds to the end of
 * the file's wait queue (DEL + ADD), so the next event goes to the poller
 * that waited longest; nothing else changes (poller_accept.c). 0 moved, 1
 * nothing to move, or -errno (an ADD refused for want of resources is
 * reported, and made again by th's later passes: poller_owed.c, fail_fd). */
int fdc_requeue(struct fdc_thread *th, int fd);

void fdc_counters(const struct fdc_thread *th, struct fdc_counters *out);

#endif /* SOCKHERD_FD_H */
