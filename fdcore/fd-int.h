/* sockherd fdcore: helpers shared by fd*.c, updlist.c and the poller's files.
 * Not part of the API: nothing outside fdcore includes this file.
 */
#ifndef SOCKHERD_FD_INT_H
#define SOCKHERD_FD_INT_H

#include <errno.h>
#include <stddef.h>

#include "fd.h"

/* counter indexes, in the order of struct fdc_counters */
enum {
	CTR_LOOPS, CTR_POLL_IO, CTR_POLL_DROP_FD, CTR_POLL_SKIP_FD, CTR_POLL_STALE,
	CTR_FD_TAKEOVER, CTR_ACCEPTED, CTR_ACCEPT_EMPTY, CTR_WAKE_NOWORK,
	CTR_WAKEUPS, CTR_CTL_ADD, CTR_CTL_MOD, CTR_CTL_DEL, CTR_CTL_ERR,
};

#define FDC_WAKE_TOKEN UINT64_MAX   /* epoll data of a thread's eventfd */

static inline void fdc_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Counters have one writer (the context's thread): a relaxed load and store
 * is enough and avoids a locked instruction on the hot path.
 */
static inline void fdc_count_n(struct fdc_thread *th, int idx, uint64_t n)
{
	uint64_t v = atomic_load_explicit(&th->ctr.v[idx], memory_order_relaxed);
	atomic_store_explicit(&th->ctr.v[idx], v + n, memory_order_relaxed);
}
#define fdc_count(th, idx) fdc_count_n((th), (idx), 1)

static inline void fdc_hook(struct fdc_table *t, int point, int tid, int fd, uint32_t gen)
{
	fdc_hook_fn fn = atomic_load_explicit(&t->hook, memory_order_acquire);

	if (__builtin_expect(fn != NULL, 0))
		fn(atomic_load(&t->hook_arg), point, tid, fd, gen);
}

static inline int fdc_fd_ok(const struct fdc_table *t, int fd)
{
	return (unsigned)fd < (unsigned)t->maxfd;
}

/* grab: takes a reference on the fd's tgid if it is `tgid`. Returns 1 with
 * the reference held, 0 without (closed fd, or owned by another group).
 * Any thread. Keeps I1: while held, the tgid cannot change.
 */
static inline int fdc_grab(struct fdc_entry *e, int tgid)
{
	uint32_t old = atomic_fetch_add(&e->refc_tgid, FDC_REF_ONE);

	if ((old & (FDC_TGID_MASK | FDC_TGID_LOCK)) == (uint32_t)tgid)
		return 1;
	atomic_fetch_sub(&e->refc_tgid, FDC_REF_ONE);
	return 0;
}

/* take: takes a reference whatever the tgid. Returns the tgid with the
 * reference held, or 0 (closed fd) without one. Any thread.
 */
static inline int fdc_take(struct fdc_entry *e)
{
	uint32_t old = atomic_fetch_add(&e->refc_tgid, FDC_REF_ONE);
	int tgid = old & FDC_TGID_MASK;

	if (!tgid || (old & FDC_TGID_LOCK))
		atomic_fetch_sub(&e->refc_tgid, FDC_REF_ONE);
	return (old & FDC_TGID_LOCK) ? 0 : tgid;
}

static inline void fdc_drop(struct fdc_entry *e)
{
	atomic_fetch_sub(&e->refc_tgid, FDC_REF_ONE);
}

/* ---- the verbs that change the tgid (I1: only while no reference but the
 * changer's own is held). Nothing else writes the low bits of refc_tgid.
 */

/* claim: takes a closed entry for group tgid, locked (grab and take refuse
 * it) and with one reference of the caller's. Waits for the transient
 * references of late visitors of the previous incarnation to go. Returns 0,
 * or -EEXIST if the entry has a tgid (the fd is in the table: I2). Insert.
 */
static inline int fdc_tgid_claim(struct fdc_entry *e, int tgid)
{
	uint32_t old = atomic_load(&e->refc_tgid);

	for (;;) {
		if (old & (FDC_TGID_MASK | FDC_TGID_LOCK))
			return -EEXIST;
		if (old & FDC_REF_MASK) {
			fdc_relax();
			old = atomic_load(&e->refc_tgid);
			continue;
		}
		if (atomic_compare_exchange_weak(&e->refc_tgid, &old,
		                                 FDC_REF_ONE | FDC_TGID_LOCK | (uint32_t)tgid))
			return 0;
	}
}

/* publish: unlocks a claimed entry, now fully written, and drops the
 * claimer's reference: grabs succeed from here on. Insert. */
static inline void fdc_tgid_publish(struct fdc_entry *e)
{
	atomic_fetch_and(&e->refc_tgid, ~FDC_TGID_LOCK);
	fdc_drop(e);
}

/* unclaim: gives a claimed entry back, closed, and drops the claimer's
 * reference. Insert, when the entry turned out not clean. */
static inline void fdc_tgid_unclaim(struct fdc_entry *e)
{
	atomic_fetch_and(&e->refc_tgid, ~(FDC_TGID_MASK | FDC_TGID_LOCK));
	fdc_drop(e);
}

/* reset: the final close sets the tgid to 0 and takes a reference of its
 * own in one step, then waits until that reference is the only one. From
 * the reset on, grabs fail; an insert of this number (possible for a
 * DISOWN fd whose owner re-inserts it) waits for our reference, so it cannot
 * claim the entry while the close is still cleaning it. On return the
 * caller is alone with the masks; it drops its reference (fdc_drop) once
 * the entry is clean. The final close only.
 */
static inline void fdc_tgid_reset(struct fdc_entry *e)
{
	uint32_t old = atomic_load(&e->refc_tgid);

	while (!atomic_compare_exchange_weak(&e->refc_tgid, &old,
	                                     (old & FDC_REF_MASK) + FDC_REF_ONE))
		;
	while ((atomic_load(&e->refc_tgid) & FDC_REF_MASK) != FDC_REF_ONE)
		fdc_relax();
}

/* Range-checks fd and takes a reference on it whatever its group (any
 * thread). Returns the entry with *tgid set and the reference held, or NULL
 * without one if fd is out of the table or closed.
 */
static inline struct fdc_entry *take_entry(struct fdc_table *t, int fd, int *tgid)
{
	struct fdc_entry *e;

	if (!fdc_fd_ok(t, fd))
		return NULL;
	e = &t->fdtab[fd];
	*tgid = fdc_take(e);
	return *tgid ? e : NULL;
}

/* links word of the shared update list (see fd-t.h) */
static inline int32_t fdc_lnext(uint64_t v) { return (int32_t)(uint32_t)v; }
static inline int32_t fdc_lprev(uint64_t v) { return (int32_t)(uint32_t)(v >> 32); }
static inline uint64_t fdc_lmk(int32_t next, int32_t prev)
{
	return (uint64_t)(uint32_t)next | ((uint64_t)(uint32_t)prev << 32);
}

/* updlist.c */
void fdc_list_add(struct fdc_table *t, struct fdc_group *g, int fd);
void fdc_list_remove(struct fdc_table *t, struct fdc_group *g, int fd);
void fdc_updt_polling(struct fdc_thread *th, int fd, int tgid);
void fdc_program_own_update(struct fdc_thread *th, int fd);
void fdc_done_update(struct fdc_thread *th, struct fdc_group *g, int fd, uint64_t remaining);
void fdc_wake_mask(struct fdc_table *t, const struct fdc_group *g, uint64_t mask);

/* poller_owed.c: th owes its caller the report of the kept edges it just took
 * off an FDC_EDGE fd's state (fd-t.h, FDC_KEPT_*). */
void fdc_replay_kept(struct fdc_thread *th, int fd, uint32_t kept);

#endif /* SOCKHERD_FD_INT_H */
