/* sockherd fdcore: the poller's registrations made outside an update pass,
 * on the accept path (poller.c tells the epoll facts they rely on):
 * accept itself, a group-shared connection's registrations in every
 * owner's instance right after its insert, and the requeue that moves a
 * thread's registration of a listener to the end of the file's wait queue.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "fd-int.h"
#include "poller-int.h"

int fdc_accept(struct fdc_thread *th, int lfd, int *out, int max)
{
	int n = 0;

	while (n < max) {
		int c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (c >= 0) {
			out[n++] = c;
			continue;
		}
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			if (!n) {
				/* woken for a connection another thread got */
				fdc_count(th, CTR_ACCEPT_EMPTY);
				fdc_cant_recv(th, lfd);
			}
			break;
		}
		if (!n)
			return -errno;
		break;
	}
	fdc_count_n(th, CTR_ACCEPTED, (uint64_t)n);
	return n;
}

/* fd.h. The registrations of a group-shared connection, right after its
 * insert: th's own instance first (the kernel offers an exclusive event to
 * the instances in the order they registered: the accepting thread keeps
 * its connections while it waits, the affinity), then each sibling's.
 * th's with EPOLLOUT besides: no direction change will ever re-register it
 * (update_fd), so it must hold both from the start; its ADD reports the
 * fresh socket writable to th itself, awake here (kept: KEPT_W). The
 * siblings' without: an ADD reporting at once would wake each of them.
 * Ordering: each polled bit is set (seq_cst) before its ADD, as update_fd
 * does, and the whole happens under a reference on the fd's tgid, so the
 * final close (which waits for references) sees every bit of an ADD made.
 */
int fdc_insert_shared(struct fdc_thread *th, int fd, uint64_t owner, uint32_t kind,
                      uint64_t thread_mask)
{
	struct fdc_table *t = th->t;
	struct fdc_group *g = &t->groups[th->tgid];
	struct fdc_entry *e;
	struct fdc_polled *pol;
	struct epoll_event ev;
	uint64_t rest, bit;
	int rc, err;

	thread_mask &= g->enabled_mask;
	if (!(thread_mask & th->ltid_bit))
		return -EINVAL;
	rc = fdc_insert(t, fd, owner, kind, th->tgid, thread_mask,
	                FDC_ACCEPTED | FDC_EXCLUSIVE);
	if (rc < 0)
		return rc;
	e = &t->fdtab[fd];
	pol = &t->polled[fd];
	if (!fdc_grab(e, th->tgid))
		return 0;                /* deleted already by a stale handle: its close */
	/* reading is wanted before any poller can report it; INSERTING keeps
	 * other threads' update passes off the fd until every ADD is made */
	atomic_fetch_or(&e->state, FDC_ACTIVE_R | FDC_EDGE | FDC_INSERTING);
	ev.data.u64 = ((uint64_t)atomic_load(&e->generation) << 32) | (uint32_t)fd;
	ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLET;
	rest = thread_mask & ~th->ltid_bit;
	for (bit = th->ltid_bit; bit; bit = rest & -rest, rest &= rest - 1) {
		int ltid = __builtin_ctzll(bit);

		atomic_fetch_or(&pol->recv, bit);
		if (bit == th->ltid_bit) {
			atomic_fetch_or(&pol->send, bit);
			ev.events = EPOLLIN | EPOLLOUT | EPOLLEXCLUSIVE | EPOLLET;
			ctl(th, EPOLL_CTL_ADD, fd, &ev, &err);
			if (err) {
				atomic_fetch_and(&pol->recv, ~bit);
				atomic_fetch_and(&pol->send, ~bit);
				fail_fd(th, fd, err);
			}
			ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLET;
			continue;
		}
		fdc_count(th, CTR_CTL_ADD);
		if (epoll_ctl(t->threads[g->base + ltid].epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
			/* that sibling does without it: the others still serve */
			atomic_fetch_and(&pol->recv, ~bit);
			fdc_count(th, CTR_CTL_ERR);
		}
	}
	/* a verb that came meanwhile (a stale handle, a test) found its pass
	 * skipped: program it again now that the registrations are real */
	if ((atomic_fetch_and(&e->state, ~FDC_INSERTING) & FDC_WANTED) != FDC_ACTIVE_R)
		fdc_updt_polling(th, fd, th->tgid);
	fdc_drop(e);
	return 0;
}

/* Moves th's registration of an EXCLUSIVE fd to the end of the file's
 * wait queue: DEL, then ADD with the same events and data. The kernel
 * hands an exclusive file's event to the first registered instance that
 * has an idle waiter, so without this the first thread of the first worker
 * to register a listener takes every connection of a light load while the
 * others sleep. A thread that just accepted requeues, and the next
 * connection goes to the poller that waited longest.
 *
 * Who: th's thread, holding fd (its running bit, from fdc_poll or
 * fdc_enter), so no final close can DEL the registration meanwhile (I4,
 * I7). Touches th's own instance only; the desired state, the update lists
 * and the other threads are left alone (a verb pair, stop_recv then
 * want_recv, would make every thread of the group DEL and ADD it and wake
 * them all). Returns 0 (moved); 1 if th does not poll fd for recv as
 * exclusive (nothing to move); -EBADF for an fd out of range; -EPERM if th
 * does not hold fd (or fd is another group's); or -errno of a failed DEL
 * or ADD, after which th polls nothing for fd and the fd is reported like
 * any failed registration (polled bits cleared, FDC_POLL_CTL at th's next
 * poll: I8). It holds a reference on the fd's tgid throughout (I1).
 * Memory ordering: seq_cst loads of running_mask, state, generation and
 * th's polled bits, all stable while th holds fd (only th changes its own
 * polled bits; the generation changes only in the final close).
 */
int fdc_requeue(struct fdc_thread *th, int fd)
{
	struct fdc_table *t = th->t;
	struct fdc_entry *e;
	struct fdc_polled *pol;
	uint64_t bit = th->ltid_bit;
	struct epoll_event ev;
	int err;

	if (fd < 0 || fd >= t->maxfd)
		return -EBADF;
	e = &t->fdtab[fd];
	pol = &t->polled[fd];
	/* running bits and polled bits are per group: an fd of another group
	 * (its thread of the same local id may hold it) is not ours (review) */
	if (!fdc_grab(e, th->tgid))
		return -EPERM;
	if (!(atomic_load(&e->running_mask) & bit)) {
		fdc_drop(e);
		return -EPERM;
	}
	if (!(atomic_load(&e->state) & FDC_EXCLUSIVE) || !(atomic_load(&pol->recv) & bit)) {
		fdc_drop(e);
		return 1;
	}
	ev.events = EPOLLIN | EPOLLEXCLUSIVE | ((atomic_load(&pol->send) & bit) ? EPOLLOUT : 0) |
	            ((atomic_load(&e->state) & FDC_EDGE) ? EPOLLET : 0);
	ev.data.u64 = ((uint64_t)atomic_load(&e->generation) << 32) | (uint32_t)fd;
	ctl(th, EPOLL_CTL_DEL, fd, NULL, &err);
	if (!err)
		ctl(th, EPOLL_CTL_ADD, fd, &ev, &err);
	if (err) {
		set_polled(pol, bit, 0, 0, 0);
		fail_fd(th, fd, err);
	}
	fdc_drop(e);
	return err ? -err : 0;
}
