/* sockherd fdcore: data layout of the fd table, thread groups and pollers.
 *
 * This header holds only types, bit layouts and the rule for who may write
 * each field under which guarantee. Operations are in fd.h.
 *
 * Vocabulary (same as HAProxy's, whose fd machinery this implements):
 *   tid     global thread index, 0 .. nbthread-1
 *   tgid    thread group id, 1 .. nbgroup (0 means "nobody": closed fd)
 *   ltid    thread index inside its group, 0 .. 63; its bit is 1 << ltid
 * Every mask below holds *group-local* thread bits: a mask value means
 * nothing unless the reader also knows, and has pinned, the fd's tgid.
 */
#ifndef SOCKHERD_FD_T_H
#define SOCKHERD_FD_T_H

#include <stdatomic.h>
#include <stdint.h>

#define FDC_MAX_GROUP_THREADS 64   /* one bit per thread in a 64-bit mask */
#define FDC_MAX_GROUPS        32   /* tgid fits the 15 low bits of refc_tgid */
#define FDC_EVBATCH           256  /* epoll events fetched per poll call */

/* ---- fd state (fdc_entry.state), one word updated atomically -------------
 *
 * Per direction three bits, in the spirit of HAProxy's FD_EV_*:
 *   ACTIVE  the upper layer wants events in this direction (want/stop);
 *           polled == active: ACTIVE alone decides epoll registration
 *           (and WATCH_HUP, below: a recv-side one without EPOLLIN).
 *   READY   no EAGAIN seen since the last report (may/cant); a new fd
 *           starts READY both ways, "ready until proven otherwise".
 *   SHUT    the peer shut this direction (RDHUP / HUP seen).
 *
 *        want_*            poll reports IN/OUT
 *   idle --------> ACTIVE -------------------> ACTIVE|READY
 *    ^   <--------   |    <-------------------     |
 *    |    stop_*     |     cant_* (EAGAIN)         |  RDHUP/HUP
 *    +---------------+----------------------- ACTIVE|READY|SHUT
 */
#define FDC_ACTIVE_R    0x00000001u
#define FDC_READY_R     0x00000002u
#define FDC_SHUT_R      0x00000004u
#define FDC_ACTIVE_W    0x00000010u
#define FDC_READY_W     0x00000020u
#define FDC_SHUT_W      0x00000040u
#define FDC_ERR         0x00000080u   /* error seen, both directions */
#define FDC_ACTIVE_RW   (FDC_ACTIVE_R | FDC_ACTIVE_W)
/* WATCH_HUP: while ACTIVE_R is off, the owner still wants to hear of a
 * hang-up or an error (want_hup/stop_hup): the fd stays registered with
 * EPOLLRDHUP alone (EPOLLHUP and EPOLLERR come with any registration), so
 * a connection whose reading is paused still learns that its peer left.
 * RDHUP is level-triggered: the owner stops it once it has seen one, or
 * every poll reports it again. Not for EXCLUSIVE fds (listeners). */
#define FDC_WATCH_HUP   0x00000008u
#define FDC_WANTED      (FDC_ACTIVE_RW | FDC_WATCH_HUP)
/* KEPT_R / KEPT_W, FDC_EDGE fds only: an edge of this direction was
 * reported while the direction was not ACTIVE. An edge-triggered report
 * comes once; the registration of an EDGE fd is never narrowed to the
 * wanted directions (poller_update.c, update_fd), so reports of a direction
 * nobody wants arrive, are not handed out, and are kept here. The verb
 * that makes the direction ACTIVE again takes the bit in the same CAS and
 * owes the caller a report (a replay), which the kernel would not send:
 * a flush that saw EAGAIN, then a writable edge consumed before its
 * want_send, then the want_send, still gets its POLL_OUT. Set only while
 * the direction is inactive, cleared only in the CAS that activates it
 * (or by an update pass that replays it): never both KEPT_x and ACTIVE_x
 * after a verb returns. */
#define FDC_KEPT_R      0x02000000u
#define FDC_KEPT_W      0x04000000u

/* last poll report: IN/PRI/OUT are replaced at each report, ERR/HUP/RDHUP
 * stay until close. These are also the event bits handed to Python.
 */
#define FDC_POLL_IN     0x00000100u
#define FDC_POLL_PRI    0x00000200u
#define FDC_POLL_OUT    0x00000400u
#define FDC_POLL_ERR    0x00000800u
#define FDC_POLL_HUP    0x00001000u
#define FDC_POLL_RDHUP  0x00002000u
#define FDC_POLL_CTL    0x00004000u   /* not from the kernel: our epoll_ctl
                                         for this fd failed (errno in
                                         ctl_errno); reported with ERR */
#define FDC_POLL_ANY    0x00007f00u
#define FDC_POLL_STICKY (FDC_POLL_ERR | FDC_POLL_HUP | FDC_POLL_RDHUP | FDC_POLL_CTL)

/* per-fd flags set at insert (the FDC_F_* subset) or by the protocol */
#define FDC_LINGER_RISK 0x00010000u   /* set SO_LINGER 0 before close (RST) */
#define FDC_CLONED      0x00020000u   /* file description also open elsewhere
                                         (dup, fork, SCM_RIGHTS): close must
                                         EPOLL_CTL_DEL from every instance */
#define FDC_EXCLUSIVE   0x00040000u   /* register with EPOLLEXCLUSIVE (ADD/DEL
                                         only, the kernel refuses MOD) */
#define FDC_SOLE        0x00080000u   /* insert only: the caller states the
                                         file description is open nowhere
                                         else, so a listening socket is not
                                         marked CLONED (which it otherwise
                                         always is: seed 004) */
#define FDC_EDGE        0x00200000u   /* registered EPOLLET (a group-shared
                                         connection, fdc_insert_shared): its
                                         owner reads until a short read, and
                                         a direction change wakes nobody and
                                         re-registers nothing (poller.c) */
#define FDC_DISOWN      0x00400000u   /* final close forgets, never close()s */
#define FDC_INSERTING   0x01000000u   /* fdc_insert_shared is still registering
                                         the fd in its siblings' pollers:
                                         update passes leave it alone */
#define FDC_MUST_CLOSE  0x00800000u   /* one-shot token: whoever clears it
                                         performs the deferred close */
#define FDC_ACCEPTED    0x00100000u   /* insert only: fd was just returned by
                                         fdc_accept (a connected socket,
                                         pollable, no listener): the probe's
                                         syscall is skipped on that hot path */
#define FDC_INSERT_FLAGS (FDC_LINGER_RISK | FDC_CLONED | FDC_EXCLUSIVE | FDC_DISOWN | \
                          FDC_SOLE | FDC_ACCEPTED)

/* ---- refc_tgid -----------------------------------------------------------
 * bits 16..31 refcount, bit 15 lock (held by insert while it writes the
 * entry; grab and take refuse a locked entry), bits 0..14 tgid. The tgid
 * changes only while the refcount is 0 (I1), so a holder of a matching
 * reference may trust the masks' numbering. The verbs that change the tgid
 * (claim, publish, unclaim, reset) are in fd-int.h, nowhere else.
 */
#define FDC_REF_ONE     0x00010000u
#define FDC_REF_MASK    0xffff0000u
#define FDC_TGID_LOCK   0x00008000u
#define FDC_TGID_MASK   0x00007fffu

/* ---- shared update list links (fdc_entry.links) ---------------------------
 * One 64-bit word: low 32 bits = next, high 32 bits = prev, CAS'ed together
 * or one half at a time (a half CAS is a whole-word CAS keeping the other
 * half, so a concurrent change of the other half simply makes it retry).
 *   next >= 0   in the list, next fd
 *   next == -1  in the list, last
 *   next == -2  locked by an add or a remove in progress
 *   next <= -3  not in the list; -next-4 is the successor it had when it was
 *               removed, so a reader standing on it can walk on.
 */
#define FDC_LIST_END     (-1)
#define FDC_LIST_LOCKED  (-2)
#define FDC_LIST_OUT     (-3)       /* "not in list, no successor" */

/* ---- one fd entry: a cache line --------------------------------------------
 * Who writes what:
 *   running_mask  OR'ed by a thread entering (poller, delete, takeover),
 *                 AND'ed off by the same thread when leaving; zeroed by the
 *                 final close once alone.
 *   thread_mask   stored by insert, takeover (CAS to the taker's bit, only
 *                 while running == own bit: the taker's bit may be new) and
 *                 delete (CAS to 0). Once 0 it stays 0 until the final
 *                 close; insert sets it only on a clean entry (I2).
 *   update_mask   a bit is set by whoever programs an update for that thread
 *                 and cleared only by that thread's update pass (or the final
 *                 close, once alone).
 *   links         shared update list of the fd's group (see above).
 *   owner         caller's cookie; 0 = closed. Written at insert and close.
 *   refc_tgid     see above.
 *   state         FDC_* bits above; atomic RMW by any thread holding a ref
 *                 or a running bit.
 *   generation    incremented by the final close, before close(); read by
 *                 pollers to drop reports about an older incarnation.
 *   ctl_errno     errno of the last failed epoll_ctl of an owner's poller
 *                 for this incarnation (0: none); written by that poller,
 *                 reset by insert and the final close.
 */
struct fdc_entry {
	_Atomic uint64_t running_mask;
	_Atomic uint64_t thread_mask;
	_Atomic uint64_t update_mask;
	_Atomic uint64_t links;
	_Atomic uint64_t owner;
	_Atomic uint32_t refc_tgid;
	_Atomic uint32_t state;
	_Atomic uint32_t generation;
	_Atomic uint32_t nb_takeover;
	_Atomic uint32_t kind;        /* caller's handler kind (listener, conn...) */
	_Atomic int32_t ctl_errno;
} __attribute__((aligned(64)));
_Static_assert(sizeof(struct fdc_entry) == 64, "an fd entry is one cache line");

/* polled_mask[fd]: group-local bits of threads whose *own* epoll instance has
 * the fd registered, per direction. Kept apart from the entry because only
 * pollers write it (each its own bit), and the final close zeroes it.
 * A recv-side registration is one of two kinds, and `hup` says which: its
 * bit set (always inside `recv`) means a hang-up watch alone (EPOLLRDHUP,
 * no EPOLLIN: WATCH_HUP with ACTIVE_R off when it was made), clear means
 * EPOLLIN. It cannot be inferred from the state at the next pass: want_recv
 * and stop_hup between two passes leave a state (ACTIVE_R, no WATCH_HUP)
 * that says nothing of the watch the kernel still holds (the TSan stress
 * failure, seed 3302437362: the pass kept the registration without EPOLLIN
 * and a resumed connection was never told of its input). 32 bytes: two
 * fds a cache line.
 */
struct fdc_polled {
	_Atomic uint64_t recv;
	_Atomic uint64_t send;
	_Atomic uint64_t hup;
	uint64_t _pad;
};
_Static_assert(sizeof(struct fdc_polled) == 32, "two polled entries a cache line");

/* Per-thread counters, mirroring HAProxy's "show activity". Each is written
 * by its own thread only (relaxed load+store, no RMW) and may be read by
 * anyone (relaxed loads): a snapshot, not a transaction.
 */
struct fdc_counters {
	uint64_t loops;          /* poll calls */
	uint64_t poll_io;        /* epoll_wait returned at least one event */
	uint64_t poll_drop_fd;   /* event/update for a closed or foreign fd */
	uint64_t poll_skip_fd;   /* event reached a thread no longer an owner */
	uint64_t poll_stale;     /* event for an older generation, dropped */
	uint64_t fd_takeover;    /* fds taken over by this thread */
	uint64_t accepted;       /* connections accepted */
	uint64_t accept_empty;   /* listener wake-ups that found nothing */
	uint64_t wake_nowork;    /* fd reports that all came to nothing */
	uint64_t wakeups;        /* eventfd wake-ups received */
	uint64_t ctl_add, ctl_mod, ctl_del, ctl_err;   /* epoll_ctl calls */
};
#define FDC_NCOUNTERS 14

struct fdc_counters_atomic {
	_Atomic uint64_t v[FDC_NCOUNTERS];
};

/* A group: threads base .. base+count-1, and its shared update list. */
struct fdc_group {
	int tgid;
	int base;
	int count;
	uint64_t enabled_mask;         /* (1 << count) - 1 */
	_Atomic int32_t first;         /* shared update list head / tail */
	_Atomic int32_t last;
	_Atomic uint32_t epoch;        /* bumped at each removal from the list:
	                                  a walker that saw it move may have been
	                                  carried past entries, and walks again */
};

struct fdc_table;

/* What a listed retry stands for (fdc_thread.retry_why[fd]): a report
 * owe() could not queue (no memory), or a listener's registration the
 * kernel refused, retried by the thread's next update pass (poller_owed.c,
 * retry_later; poller_update.c, retry_owed). */
#define FDC_RETRY_KEPT  0x01   /* kept edges put back on ACTIVE directions
                                  (fdc_replay_kept): take them again. The
                                  only time an EDGE fd's state holds KEPT_x
                                  and ACTIVE_x after a verb returned: an
                                  owner has the fd listed for this */
#define FDC_RETRY_CTL   0x02   /* a failed registration's report (fail_fd) */
#define FDC_RETRY_ADD   0x04   /* a registration of an EXCLUSIVE fd that is
                                  not EDGE (a listener) refused for want of
                                  resources (ENOSPC, ENOMEM): made again. Its
                                  owner has nothing to close, and no verb
                                  re-makes one thread's registration alone
                                  (poller_owed.c, fail_fd) */
/* back-off of a thread's wait while retries are listed, in ms */
#define FDC_RETRY_MIN_MS 1
#define FDC_RETRY_MAX_MS 128

/* A thread context. Exactly one OS thread at a time may use a context: its
 * local update list and epoll instance are not shared. Other threads only
 * read epfd (to DEL a cloned fd on close) and write evfd (to wake it).
 */
struct fdc_thread {
	struct fdc_table *t;
	int tid, tgid, ltid;
	uint64_t ltid_bit;
	int epfd;                      /* own epoll instance */
	int evfd;                      /* eventfd polled by it, for wake-ups */
	int *updt;                     /* local update list: fds, no duplicates
	                                  thanks to the own update bit */
	int nbupdt;
	int nbwalk;                    /* updt[0 .. nbwalk) belong to the update
	                                  pass under way (0 outside one): a final
	                                  close never trims them (fd.c) */
	int in_pass;                   /* inside fdc_update_pass (reentry guard) */
	struct fdc_owed {              /* reports th owes its caller, made by */
		int32_t fd;            /* its next fdc_poll before it waits: */
		uint32_t gen;          /* failed registrations (ERR | CTL) and */
		uint32_t events;       /* kept edges replayed (IN, OUT); one */
	} *owed;                       /* entry per incarnation; grows on demand */
	int nbowed, capowed;
	/* Retries of reports owe() could not queue (no memory) and of
	 * listeners' refused registrations (FDC_RETRY_*): at most one
	 * entry per fd, a ring of maxfd slots allocated with the context, so
	 * listing a retry never allocates. retry_why[fd] says what to retry
	 * (FDC_RETRY_*, above) and is 0 while fd is not listed: the guard
	 * that keeps one entry per fd whatever walk met it. Attempted at the
	 * start of each update pass; while any is left, the poller's wait is
	 * bounded by retry_ms, doubled at each attempt that fails again (a
	 * back-off, never a wake-up of itself). th's thread only. */
	int *retry;
	uint8_t *retry_why;
	int retry_head, nbretry, retry_ms;
	struct fdc_counters_atomic ctr;
};

/* Test hooks: called, if set, at named points of the protocols so tests can
 * run another thread's step exactly there (deterministic interleavings).
 * A hook must not close the fd it is called for while the caller holds a
 * reference (the close would wait for that reference forever).
 */
enum fdc_hook_point {
	FDC_HK_ENTER_RUNNING = 1,  /* enter: own running bit OR'ed, not yet checked */
	FDC_HK_ENTER_RETRY,        /* enter: consistency loop must re-read */
	FDC_HK_LEAVE,              /* leave: about to clear own running bit */
	FDC_HK_TAKEOVER_OWNED,     /* takeover: running CAS'ed, thread_mask not yet set */
	FDC_HK_DELETE_ORPHANED,    /* delete: thread_mask = 0, own running bit held */
	FDC_HK_UPDATE_CONSUMED,    /* update pass: own update bit just cleared */
	FDC_HK_CLOSE_BEGIN,        /* final close: starting, tgid not yet reset */
	FDC_HK_CLOSE_DRAINED,      /* final close: tgid reset, refcount drained */
	FDC_HK_CLOSE_END,          /* final close: fd about to be close()d */
	FDC_HK_BEFORE_WAIT,        /* poll: update pass done, entering epoll_wait */
	FDC_HK_RELEASE_CLEARED,    /* release: own running bit cleared, thread_mask
	                              not yet read (leave, enter's exit, delete,
	                              takeover) */
	FDC_HK_WALK_ARRIVE,        /* update pass: standing on a shared-list entry,
	                              before grabbing it or reading its links */
	FDC_HK_LIST_UNLINK,        /* list remove: entry and neighbours locked,
	                              about to unlink (tid -1: no thread context) */
	FDC_HK_ENTER_OWNER,        /* enter: own bit seen in thread_mask, running
	                              bit not yet OR'ed */
};
typedef void (*fdc_hook_fn)(void *arg, int point, int tid, int fd, uint32_t gen);

struct fdc_table {
	int maxfd;
	int nbthread;
	int nbgroup;
	struct fdc_entry *fdtab;
	struct fdc_polled *polled;
	struct fdc_group groups[FDC_MAX_GROUPS + 1];   /* indexed by tgid */
	struct fdc_thread *threads;                    /* indexed by tid */
	int probe_epfd;                                /* scratch epoll of insert's
	                                                  "can it be polled?" probe */
	_Atomic(fdc_hook_fn) hook;
	void *_Atomic hook_arg;
};

#endif /* SOCKHERD_FD_T_H */
