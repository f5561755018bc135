/* sockherd fdcore: the reports a poller thread owes its caller (a failed
 * registration, FDC_POLL_CTL; a kept edge's replay, FDC_KEPT_*), made by
 * its next fdc_poll before it waits (poller.c, report_owed), and the retry
 * ring of what could not be queued for want of memory or was refused by
 * the kernel, made again by its later update passes (poller_update.c,
 * retry_owed). Shared with the other poller files through poller-int.h;
 * fdc_replay_kept with fd_verbs.c through fd-int.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "fd-int.h"
#include "poller-int.h"

/* Queues a report th owes its caller about incarnation gen of fd, made by
 * th's next fdc_poll before it waits (report_owed): merged into the one
 * already owed for that incarnation, if any, so a failure and a replay,
 * or two failed attempts, make one report. th's thread (the list is
 * th's own). Returns 0, or -ENOMEM if the list could not grow (nothing
 * queued).
 */
int owe(struct fdc_thread *th, int fd, uint32_t gen, uint32_t events)
{
	/* owed reports are few and the list short: a scan, not an index */
	for (int i = 0; i < th->nbowed; i++)
		if (th->owed[i].fd == fd && th->owed[i].gen == gen) {
			th->owed[i].events |= events;
			return 0;
		}
	if (th->nbowed == th->capowed) {
		int cap = th->capowed ? 2 * th->capowed : 16;
		struct fdc_owed *p = realloc(th->owed, sizeof(*p) * (size_t)cap);

		if (!p)
			return -ENOMEM;
		th->owed = p;
		th->capowed = cap;
	}
	th->owed[th->nbowed].fd = fd;
	th->owed[th->nbowed].gen = gen;
	th->owed[th->nbowed].events = events;
	th->nbowed++;
	return 0;
}

/* Lists fd for a retry (FDC_RETRY_*, fd-t.h): of a report owe() could not
 * queue (no memory), or of a listener's refused registration (fail_fd);
 * made by th's next update pass (retry_owed), not by the walk under way.
 * One entry per fd, whatever walk (local, shared, the retry's own) met it
 * and however often: an fd already listed only gains `why`. Never
 * allocates (the ring has a slot per fd: fd-t.h), so it cannot fail.
 * Nobody is woken: the wait that follows is bounded by th->retry_ms
 * (poll_round), set here to its minimum if no retry was pending. th's
 * thread (the ring is th's own), holding a reference on the fd's tgid
 * (fd < maxfd). Keeps: nbretry == the number of fds whose retry_why is
 * non-zero. Plain memory, th's own: no ordering. */
void retry_later(struct fdc_thread *th, int fd, uint8_t why)
{
	int maxfd = th->t->maxfd;

	if (th->retry_why[fd]) {
		th->retry_why[fd] |= why;
		return;
	}
	th->retry_why[fd] = why;
	th->retry[(th->retry_head + th->nbretry) % maxfd] = fd;
	th->nbretry++;
	if (!th->retry_ms)
		th->retry_ms = FDC_RETRY_MIN_MS;
}

/* Records that th's registration of fd failed with errno err and queues the
 * fd for a report to its owner by th's next fdc_poll (FDC_POLL_CTL; the
 * report itself is made under a running bit there). Every failed attempt
 * is reported unless a report of this incarnation is already pending on
 * th: a new owner after a takeover, or the owner retrying after a report,
 * hears of its own failure too. If the report cannot be queued (no
 * memory), fd is listed for a retry by a later pass (retry_later): never
 * dropped. th's thread, holding a reference on the fd's tgid (so the
 * generation is the live incarnation's). Memory ordering: the errno is
 * stored before the state's FDC_POLL_CTL (both seq_cst), so whoever sees
 * the flag reads this errno or a later failure's.
 */
void fail_fd(struct fdc_thread *th, int fd, int err)
{
	struct fdc_entry *e = &th->t->fdtab[fd];
	uint32_t st;

	atomic_store(&e->ctl_errno, err);
	st = atomic_fetch_or(&e->state, FDC_ERR | FDC_POLL_CTL);
	/* out of memory while failing: a later pass tells it (retry_owed).
	 * Dropped, the owner of a connection nobody polls any more waited
	 * for events that never came (tests/c/repro/ctl_report_nomem.c) */
	if (owe(th, fd, atomic_load(&e->generation), FDC_POLL_ERR | FDC_POLL_CTL) < 0)
		retry_later(th, fd, FDC_RETRY_CTL);
	/* a listener (EXCLUSIVE, not a group-shared connection) refused for
	 * want of resources: made again by later passes, with the ring's
	 * back-off. Its owner has nothing to close, and no verb re-makes
	 * th's registration alone: left unpolled, a requeue's ADD that failed
	 * after its DEL (or the want_recv that resumes accepting) cost th
	 * the listener for good, and a worker of one thread every connection
	 * (tests/c/repro/listener_requeue_fail.c). Not for a number whose
	 * file went away (ENOENT, EBADF: never ADD what holds it now), nor a
	 * connection (its owner closes it on the report). */
	if ((st & (FDC_EXCLUSIVE | FDC_EDGE)) == FDC_EXCLUSIVE && (err == ENOSPC || err == ENOMEM))
		retry_later(th, fd, FDC_RETRY_ADD);
}

/* The report a kept edge stands for (fd-t.h, FDC_KEPT_*). */
static uint32_t kept_events(uint32_t kept)
{
	return (kept & FDC_KEPT_R ? FDC_POLL_IN : 0) | (kept & FDC_KEPT_W ? FDC_POLL_OUT : 0);
}

/* fd-int.h. th took the kept edges `kept` (FDC_KEPT_R / FDC_KEPT_W) off
 * the state of FDC_EDGE fd, in the CAS that made their directions ACTIVE
 * (fd_verbs.c, change_state) or in its update pass (take_kept): it now owes its
 * caller their report (POLL_IN, POLL_OUT), made by its next fdc_poll
 * before it waits, as the kernel would have made it had the direction
 * been wanted when the edge came.
 * Who: th's thread, an owner of fd in th's group, holding a reference on
 * the fd's tgid (the generation read here is the live incarnation's: it
 * changes only in the final close, which waits for references).
 * Returns nothing: if the report cannot be queued (no memory), the bits
 * go back on the state (ACTIVE and KEPT both set, for once) and fd is
 * listed for a retry (retry_later): th's next update pass takes them
 * again (or another owner's pass does first: take_kept), never the walk
 * under way, and th waits with a back-off meanwhile. Never lost, listed
 * once per fd. Not on an update list: the local walk and the shared
 * walk both met such an entry, and each re-listed it (review of fd3c058:
 * one more local-list copy per pass on an fd shared with a sleeping
 * sibling, th woken at each, until local_append's trap;
 * tests/c/repro/replay_kept_shared_nomem.c).
 * Memory ordering: seq_cst RMW on the state, as every writer of it.
 */
void fdc_replay_kept(struct fdc_thread *th, int fd, uint32_t kept)
{
	struct fdc_entry *e = &th->t->fdtab[fd];

	if (owe(th, fd, atomic_load(&e->generation), kept_events(kept)) == 0)
		return;
	atomic_fetch_or(&e->state, kept);
	retry_later(th, fd, FDC_RETRY_KEPT);
}

/* An update pass's part of the replay: edges kept on directions ACTIVE
 * now, which the verb that activated them could not take (its caller was
 * no owner of fd: fd_verbs.c, change_state), are taken by th, which owes their
 * report. th's thread, an owner, holding a reference on the fd's tgid.
 * The CAS takes only bits whose direction is still ACTIVE: one taker per
 * kept edge, whoever it is (a verb, or another owner's pass).
 * Memory ordering: a seq_cst CAS on the state, the word apply_report and
 * change_state CAS too: a kept edge is taken by exactly one of them.
 */
void take_kept(struct fdc_thread *th, int fd)
{
	struct fdc_entry *e = &th->t->fdtab[fd];
	uint32_t old = atomic_load(&e->state), take;

	do {
		take = old & ((old & FDC_ACTIVE_R ? FDC_KEPT_R : 0) |
		              (old & FDC_ACTIVE_W ? FDC_KEPT_W : 0));
		if (!take)
			return;
	} while (!atomic_compare_exchange_weak(&e->state, &old, old & ~take));
	fdc_replay_kept(th, fd, take);
}
