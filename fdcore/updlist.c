/* sockherd fdcore: programming poller updates.
 *
 * A change of ACTIVE bits must reach the epoll instance of every thread that
 * owns the fd, and each instance may only be changed by its own thread (I7).
 * So a change is *programmed* here and *applied* by each owner's update pass
 * (poller.c) before it next sleeps:
 *   - an fd owned by the calling thread alone goes on that thread's local
 *     list, guarded by its own update bit (a set bit means "already queued");
 *   - any other fd (a listener shared by several threads, or a change made
 *     by a non-owner) sets update_mask = thread_mask and goes on its group's
 *     shared list, which every thread of the group walks; the last thread to
 *     consume it removes it, re-checking for a re-arm (HAProxy 6b96f7289).
 * Owners other than the caller are woken so the change applies promptly.
 *
 * The shared list is a lock-free doubly-linked list threaded through the fd
 * entries (links word, encoding in fd-t.h). Writers lock the links they are
 * about to change by storing -2 with a CAS and never wait while holding a
 * lock: a failed neighbour lock is undone and retried. Readers never lock:
 * they wait out a -2 and follow a removed entry's remembered successor.
 */
#define _GNU_SOURCE
#include <unistd.h>

#include "fd-int.h"

/* CAS of one half of a links word, keeping the other half. Returns 1 if the
 * half was `expect` and is now `want`, 0 if it was something else.
 */
static int links_cas_half(struct fdc_entry *e, int upper, int32_t expect, int32_t want)
{
	uint64_t v = atomic_load(&e->links);

	for (;;) {
		int32_t cur = upper ? fdc_lprev(v) : fdc_lnext(v);
		uint64_t nv;

		if (cur != expect)
			return 0;
		nv = upper ? fdc_lmk(fdc_lnext(v), want) : fdc_lmk(want, fdc_lprev(v));
		if (atomic_compare_exchange_weak(&e->links, &v, nv))
			return 1;
	}
}

/* Adds fd to group g's shared list unless it is already there.
 * Any thread holding a reference on the fd's tgid (so the fd cannot be
 * closed, and removed from the list by the close, under our feet).
 * A locked entry may be being added *or removed* (HAProxy fc51f0f58 lost
 * entries by assuming "added"): wait for it to settle, then decide.
 */
void fdc_list_add(struct fdc_table *t, struct fdc_group *g, int fd)
{
	struct fdc_entry *e = &t->fdtab[fd];
	uint64_t v = atomic_load(&e->links);
	int32_t last;

	/* lock ourselves: next from "out" to locked, prev locked until published
	 * so a remover of our future predecessor waits for us.
	 */
	for (;;) {
		int32_t next = fdc_lnext(v);

		if (next >= FDC_LIST_END)
			return;
		if (next == FDC_LIST_LOCKED) {
			fdc_relax();
			v = atomic_load(&e->links);
			continue;
		}
		if (atomic_compare_exchange_weak(&e->links, &v,
		                                 fdc_lmk(FDC_LIST_LOCKED, FDC_LIST_LOCKED)))
			break;
	}

	/* append: past this point we are reachable but still locked */
	for (;;) {
		last = atomic_load(&g->last);
		if (last == FDC_LIST_END) {
			int32_t expect = FDC_LIST_END;

			if (atomic_compare_exchange_strong(&g->last, &expect, fd)) {
				/* the list was empty and only we can set first now */
				atomic_store(&g->first, fd);
				break;
			}
		}
		else if (links_cas_half(&t->fdtab[last], 0, FDC_LIST_END, fd)) {
			int32_t expect = last;

			/* the old tail points at us; other adders spin until this.
			 * A CAS, not a store: between our read of g->last and our
			 * link, `last` may have left this list, been closed,
			 * re-inserted in another group and become the tail of *that*
			 * list (next == END again). Nobody else can move g->last off
			 * a genuine tail we linked to (adders need its next == END, a
			 * remover needs our prev half, still locked), so a failure
			 * means exactly that ABA: unlink again and retry. A remover
			 * of `last` may hold its links for an instant meanwhile.
			 * (Found by the fdcore stress benchmark.)
			 */
			if (atomic_compare_exchange_strong(&g->last, &expect, fd))
				break;
			while (!links_cas_half(&t->fdtab[last], 0, fd, FDC_LIST_END))
				fdc_relax();
		}
		fdc_relax();
	}

	/* publish: tail of the list, predecessor `last` (-1 if none) */
	atomic_store(&e->links, fdc_lmk(FDC_LIST_END, last));
}

/* Removes fd from group g's shared list if it is there. Any thread holding
 * a reference on the fd's tgid, or the final close once alone.
 * Lock order: self, then next's prev, then prev's next; a failure undoes
 * everything and retries, so nobody waits while holding a lock.
 */
void fdc_list_remove(struct fdc_table *t, struct fdc_group *g, int fd)
{
	struct fdc_entry *e = &t->fdtab[fd];
	int32_t next, prev;
	unsigned spins = 1;

	for (;;) {
		uint64_t v = atomic_load(&e->links);

		next = fdc_lnext(v);
		prev = fdc_lprev(v);
		if (next <= FDC_LIST_OUT)
			return;
		if (next == FDC_LIST_LOCKED || prev == FDC_LIST_LOCKED ||
		    !atomic_compare_exchange_strong(&e->links, &v,
		                                    fdc_lmk(FDC_LIST_LOCKED, FDC_LIST_LOCKED)))
			goto backoff;

		if (next != FDC_LIST_END &&
		    !links_cas_half(&t->fdtab[next], 1, fd, FDC_LIST_LOCKED)) {
			atomic_store(&e->links, fdc_lmk(next, prev));
			goto backoff;
		}
		if (prev != FDC_LIST_END &&
		    !links_cas_half(&t->fdtab[prev], 0, fd, FDC_LIST_LOCKED)) {
			if (next != FDC_LIST_END)
				links_cas_half(&t->fdtab[next], 1, FDC_LIST_LOCKED, fd);
			atomic_store(&e->links, fdc_lmk(next, prev));
			goto backoff;
		}
		break;
	backoff:
		/* two neighbours removing at once each undo for the other: a
		 * growing pause breaks the symmetry */
		for (unsigned i = 0; i < spins; i++)
			fdc_relax();
		if (spins < 1024)
			spins <<= 1;
	}

	/* the list is locked from prev to next: unlink. Head and tail move
	 * first, while both neighbours are still locked: released earlier, a
	 * neighbour could be removed in between and `last` would then be set to
	 * an entry no longer in the list, on which every later add spins
	 * (found by the fdcore stress benchmark).
	 */
	fdc_hook(t, FDC_HK_LIST_UNLINK, -1, fd, 0);
	if (next == FDC_LIST_END) {
		int32_t expect = fd;
		atomic_compare_exchange_strong(&g->last, &expect, prev);
	}
	if (prev == FDC_LIST_END) {
		int32_t expect = fd;
		atomic_compare_exchange_strong(&g->first, &expect, next);
	}
	if (prev != FDC_LIST_END)
		links_cas_half(&t->fdtab[prev], 0, FDC_LIST_LOCKED, next);
	if (next != FDC_LIST_END)
		links_cas_half(&t->fdtab[next], 1, FDC_LIST_LOCKED, prev);
	/* tell walkers a removal happened (walk_shared, poller_update.c) exactly
	 * here: unlinked, so a walker that reads the counter after this bump
	 * finds `first` and every link already without us; still locked, so
	 * nobody can re-add us before the bump, and a walker standing on us
	 * waits for the store below. Bumped before the unlink, a walker could
	 * read the new value, then `first` still naming us (issue 6, bug 2);
	 * bumped after the store below, a re-add could complete before it
	 * (review finding 1): either way a walker follows our links after a
	 * re-add at the tail, skips the entries in between, and sees nothing
	 * telling it to walk again. seq_cst, between the unlink and the store:
	 * keep it there.
	 */
	atomic_fetch_add(&g->epoch, 1);
	/* out, remembering the successor for a reader standing on us */
	atomic_store(&e->links, fdc_lmk(-next - 4, FDC_LIST_END));
}

void fdc_wake_mask(struct fdc_table *t, const struct fdc_group *g, uint64_t mask)
{
	while (mask) {
		int ltid = __builtin_ctzll(mask);

		mask &= mask - 1;
		fdc_wake(t, g->base + ltid);
	}
}

/* Appends fd to th's local update list. Only th's thread. The own update
 * bit (set by the caller) keeps an incarnation from being listed twice;
 * numbers left by closed incarnations are the only other entries, so the
 * list only fills up if th never polls: then apply it now (we are th).
 */
static void local_append(struct fdc_thread *th, int fd)
{
	if (th->nbupdt >= th->t->maxfd) {
		if (th->in_pass)
			__builtin_trap();   /* impossible: one entry per fd and pass */
		fdc_update_pass(th);
	}
	th->updt[th->nbupdt++] = fd;
}

/* Queues an update of fd for th's own poller (to ADD/MOD/DEL its own
 * registration). Only th's thread, holding a reference or a running bit.
 */
void fdc_program_own_update(struct fdc_thread *th, int fd)
{
	struct fdc_entry *e = &th->t->fdtab[fd];

	if (!(atomic_fetch_or(&e->update_mask, th->ltid_bit) & th->ltid_bit))
		local_append(th, fd);
}

/* Programs the poller update of fd after its ACTIVE bits changed. Any
 * thread, holding a reference on the fd's tgid, which is `tgid` (possibly
 * not th's group). Keeps I6: each bit it sets is on a list its thread walks.
 */
void fdc_updt_polling(struct fdc_thread *th, int fd, int tgid)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e = &t->fdtab[fd];
	struct fdc_group *g = &t->groups[tgid];
	uint64_t tmask = atomic_load(&e->thread_mask);
	uint64_t self = tgid == th->tgid ? th->ltid_bit : 0;
	uint64_t um;

	if (!tmask)
		return;   /* being deleted: the final close cleans the pollers */

	if (self && tmask == self) {
		fdc_program_own_update(th, fd);
		return;
	}

	um = atomic_load(&e->update_mask);
	while ((um | tmask) != um &&
	       !atomic_compare_exchange_weak(&e->update_mask, &um, um | tmask))
		;
	fdc_list_add(t, g, fd);
	/* a group-shared connection (FDC_EDGE): only the changing thread's
	 * own registration matters before it sleeps (it passes anyway); the
	 * others apply theirs when they next pass. Waking them would wake
	 * every thread of the group at each change of one connection */
	if (!(atomic_load(&e->state) & FDC_EDGE))
		fdc_wake_mask(t, g, tmask & ~self);
}

/* Called by th's update pass for an entry of the shared list: consumes th's
 * update bit (already cleared by the caller, `remaining` = bits left) and, if
 * no bit is left, removes the entry; a re-arm seen after the removal puts it
 * back and wakes the threads it is for (else they could sleep through it).
 * th's thread, holding a reference on the fd's tgid. Keeps I6.
 * Ordering: the removal's store marking the entry out, then the load of
 * update_mask, must stay in this order (seq_cst; never relax them). A
 * programmer ORs update_mask and then adds the entry (which looks at the
 * links): of the two, at least one sees the other's store, so either we
 * see the re-arm and put the entry back, or the programmer finds it out
 * and adds it itself (HAProxy 6b96f7289).
 */
void fdc_done_update(struct fdc_thread *th, struct fdc_group *g, int fd, uint64_t remaining)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e = &t->fdtab[fd];

	while (!(remaining & g->enabled_mask)) {
		fdc_list_remove(t, g, fd);
		remaining = atomic_load(&e->update_mask);
		if (!(remaining & g->enabled_mask))
			break;
		fdc_list_add(t, g, fd);
		fdc_wake_mask(t, g, remaining & g->enabled_mask & ~th->ltid_bit);
		remaining = atomic_load(&e->update_mask);
	}
}
