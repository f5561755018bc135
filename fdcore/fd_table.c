/* sockherd fdcore: the fd table (its creation, its threads' epoll and
 * eventfd), an incarnation's insert, the listeners' copies across groups
 * and the inspection. The life of an incarnation after its insert: fd.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "fd-int.h"

const char *fdc_version(void)
{
	return "1";
}

/* ---- table ---- */

void fdc_table_free(struct fdc_table *t)
{
	if (!t)
		return;
	if (t->threads) {
		for (int i = 0; i < t->nbthread; i++) {
			struct fdc_thread *th = &t->threads[i];

			if (th->epfd >= 0)
				close(th->epfd);
			if (th->evfd >= 0)
				close(th->evfd);
			free(th->updt);
			free(th->owed);
			free(th->retry);
			free(th->retry_why);
		}
		free(t->threads);
	}
	if (t->probe_epfd >= 0)
		close(t->probe_epfd);
	free(t->fdtab);
	free(t->polled);
	free(t);
}

static int thread_init(struct fdc_table *t, struct fdc_thread *th)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = FDC_WAKE_TOKEN };

	th->updt = malloc(sizeof(*th->updt) * (size_t)t->maxfd);
	/* the retry ring of reports that could not be queued: allocated now,
	 * so that a retry is listed without memory (poller_owed.c, retry_later) */
	th->retry = malloc(sizeof(*th->retry) * (size_t)t->maxfd);
	th->retry_why = calloc((size_t)t->maxfd, sizeof(*th->retry_why));
	if (!th->updt || !th->retry || !th->retry_why)
		return -ENOMEM;
	th->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (th->epfd < 0)
		return -errno;
	th->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (th->evfd < 0)
		return -errno;
	if (epoll_ctl(th->epfd, EPOLL_CTL_ADD, th->evfd, &ev) < 0)
		return -errno;
	return 0;
}

struct fdc_table *fdc_table_new(int maxfd, int nbthread, int nbgroup, int *err)
{
	struct fdc_table *t;
	int per, rem, base = 0, rc;

	if (maxfd <= 0 || nbthread <= 0 || nbgroup <= 0 || nbgroup > FDC_MAX_GROUPS ||
	    nbgroup > nbthread || maxfd > (1 << 30)) {
		*err = -EINVAL;
		return NULL;
	}
	per = nbthread / nbgroup;
	rem = nbthread % nbgroup;
	if (per + (rem ? 1 : 0) > FDC_MAX_GROUP_THREADS) {
		*err = -EINVAL;
		return NULL;
	}

	t = calloc(1, sizeof(*t));
	if (!t) {
		*err = -ENOMEM;
		return NULL;
	}
	t->probe_epfd = -1;   /* fdc_table_free on an early failure must not close fd 0 */
	t->maxfd = maxfd;
	t->nbthread = nbthread;
	t->nbgroup = nbgroup;
	t->fdtab = aligned_alloc(64, sizeof(*t->fdtab) * (size_t)maxfd);
	t->polled = calloc((size_t)maxfd, sizeof(*t->polled));
	t->threads = calloc((size_t)nbthread, sizeof(*t->threads));
	if (!t->fdtab || !t->polled || !t->threads) {
		fdc_table_free(t);
		*err = -ENOMEM;
		return NULL;
	}
	memset(t->fdtab, 0, sizeof(*t->fdtab) * (size_t)maxfd);
	for (int fd = 0; fd < maxfd; fd++)
		atomic_init(&t->fdtab[fd].links, fdc_lmk(FDC_LIST_OUT, FDC_LIST_END));
	for (int i = 0; i < nbthread; i++)
		t->threads[i].epfd = t->threads[i].evfd = -1;
	t->probe_epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->probe_epfd < 0) {
		*err = -errno;
		fdc_table_free(t);
		return NULL;
	}

	for (int g = 1; g <= nbgroup; g++) {
		struct fdc_group *grp = &t->groups[g];

		grp->tgid = g;
		grp->base = base;
		grp->count = per + (g <= rem ? 1 : 0);
		grp->enabled_mask = grp->count == 64 ? ~0ULL : (1ULL << grp->count) - 1;
		atomic_init(&grp->first, FDC_LIST_END);
		atomic_init(&grp->last, FDC_LIST_END);
		for (int l = 0; l < grp->count; l++) {
			struct fdc_thread *th = &t->threads[base + l];

			th->t = t;
			th->tid = base + l;
			th->tgid = g;
			th->ltid = l;
			th->ltid_bit = 1ULL << l;
		}
		base += grp->count;
	}
	for (int i = 0; i < nbthread; i++) {
		rc = thread_init(t, &t->threads[i]);
		if (rc < 0) {
			fdc_table_free(t);
			*err = rc;
			return NULL;
		}
	}
	*err = 0;
	return t;
}

struct fdc_thread *fdc_thread(struct fdc_table *t, int tid)
{
	if (tid < 0 || tid >= t->nbthread)
		return NULL;
	return &t->threads[tid];
}

void fdc_thread_info(const struct fdc_thread *th, int *tgid, int *ltid, int *epfd)
{
	*tgid = th->tgid;
	*ltid = th->ltid;
	*epfd = th->epfd;
}

void fdc_set_hook(struct fdc_table *t, fdc_hook_fn fn, void *arg)
{
	atomic_store(&t->hook_arg, arg);
	atomic_store_explicit(&t->hook, fn, memory_order_release);
}

/* ---- insert ---- */

/* What the kernel says fd is, before it enters the table. Returns the
 * insert flags to add (FDC_CLONED for a listening socket, unless the caller
 * vouched with FDC_SOLE that it is open nowhere else), or a negative errno:
 * -EBADF for a number that is not open, -EPERM for a file epoll refuses
 * (regular files, directories, /dev/null and other devices without poll,
 * O_PATH fds, an epoll fd asked EXCLUSIVE): its ADD would fail for ever,
 * and the owner would wait for events that never come.
 * Why listeners are CLONED by default: every sockherd listener is also open
 * in the master (and dup'ed per group), so its close() leaves it registered
 * in every epoll instance of ours that had it: HAProxy's seed 004, four
 * threads spinning on a listener bound to one.
 * Cost: one getsockopt for a socket, which epoll always accepts (the accept
 * path skips even that with FDC_ACCEPTED). Anything else is asked of the
 * kernel itself, an ADD + DEL on the table's scratch epoll instance: no
 * guess by file type (procfs files poll, /dev/null does not).
 */
static int probe_fd(struct fdc_table *t, int fd, uint32_t flags)
{
	/* as the pollers will register it: EPOLLEXCLUSIVE is refused on some
	 * files that plain registration accepts (an epoll fd) */
	struct epoll_event ev = {
		.events = flags & FDC_EXCLUSIVE ? EPOLLIN | EPOLLEXCLUSIVE : 0,
	};
	int listening = 0;
	socklen_t len = sizeof(listening);

	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0)
		return listening && !(flags & FDC_SOLE) ? FDC_CLONED : 0;
	if (errno == EBADF) {
		/* not open, or an O_PATH fd (open, but nothing can poll it) */
		return fcntl(fd, F_GETFD) < 0 ? -EBADF : -EPERM;
	}
	if (epoll_ctl(t->probe_epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		/* EEXIST: another insert of this number is probing it too */
		if (errno == EEXIST)
			return 0;
		return errno == EPERM || errno == EINVAL ? -EPERM : -errno;
	}
	epoll_ctl(t->probe_epfd, EPOLL_CTL_DEL, fd, NULL);
	return 0;
}

int fdc_insert(struct fdc_table *t, int fd, uint64_t owner, uint32_t kind,
               int tgid, uint64_t thread_mask, uint32_t flags)
{
	struct fdc_entry *e;
	int extra, rc;

	if (!fdc_fd_ok(t, fd))
		return -EBADF;
	if (tgid < 1 || tgid > t->nbgroup || !owner || (flags & ~FDC_INSERT_FLAGS))
		return -EINVAL;
	thread_mask &= t->groups[tgid].enabled_mask;
	if (!thread_mask)
		return -EINVAL;
	/* at least one syscall per insert (about 0.4 us here, bench/RESULTS.md):
	 * the accept path, where we know what the fd is, goes without */
	extra = flags & FDC_ACCEPTED ? 0 : probe_fd(t, fd, flags);
	if (extra < 0)
		return extra;
	flags = (flags | (uint32_t)extra) & ~(FDC_SOLE | FDC_ACCEPTED);
	/* SO_LINGER 0 before our close() turns the socket's *last* close into
	 * a reset: for a disowned or cloned fd that close is somebody else's,
	 * later, on a connection still in use (HAProxy sets it regardless) */
	if ((flags & FDC_LINGER_RISK) && (flags & (FDC_DISOWN | FDC_CLONED)))
		return -EINVAL;
	e = &t->fdtab[fd];

	/* claim the entry locked: a verb racing on this number (a stale
	 * handle) cannot land half-way and poison it */
	rc = fdc_tgid_claim(e, tgid);
	if (rc < 0)
		return rc;

	/* I2: a clean entry, else a close did not finish or the caller lies */
	if (atomic_load(&e->owner) || atomic_load(&e->state) ||
	    atomic_load(&e->running_mask) || atomic_load(&e->thread_mask)) {
		fdc_tgid_unclaim(e);
		return -EEXIST;
	}

	/* update_mask and polled masks are not reset: a clean close left them
	 * zero, and clearing a bit someone else set would break I6.
	 */
	atomic_store(&e->kind, kind);
	atomic_store(&e->nb_takeover, 0);
	atomic_store(&e->ctl_errno, 0);
	atomic_store(&e->state, FDC_READY_R | FDC_READY_W | flags);
	atomic_store(&e->thread_mask, thread_mask);
	atomic_store(&e->owner, owner);
	fdc_tgid_publish(e);
	return 0;
}

/* ---- listeners across groups ---- */

int fdc_listener_fds(struct fdc_table *t, int fd, uint64_t tgids, int *out)
{
	uint64_t valid = ((1ULL << t->nbgroup) - 1) << 1;
	int n = 0;

	for (int g = 0; g <= FDC_MAX_GROUPS; g++)
		out[g] = -1;
	if (fd < 0 || !tgids || (tgids & ~valid))
		return -EINVAL;
	for (int g = 1; g <= t->nbgroup; g++) {
		if (!(tgids & (1ULL << g)))
			continue;
		if (!n) {
			out[g] = fd;
		}
		else {
			out[g] = fcntl(fd, F_DUPFD_CLOEXEC, 0);
			if (out[g] < 0) {
				int err = -errno;

				for (int h = 1; h < g; h++)
					if (out[h] >= 0 && out[h] != fd)
						close(out[h]);
				for (int h = 0; h <= FDC_MAX_GROUPS; h++)
					out[h] = -1;
				return err;
			}
		}
		n++;
	}
	return n;
}

/* ---- inspection ---- */

int fdc_dump(struct fdc_table *t, int fd, struct fdc_fdinfo *out)
{
	struct fdc_entry *e;
	uint32_t rt;

	if (!fdc_fd_ok(t, fd))
		return -EBADF;
	e = &t->fdtab[fd];
	rt = atomic_load(&e->refc_tgid);
	out->fd = fd;
	out->tgid = rt & FDC_TGID_MASK;
	out->refcount = rt >> 16;
	out->state = atomic_load(&e->state);
	out->generation = atomic_load(&e->generation);
	out->nb_takeover = atomic_load(&e->nb_takeover);
	out->kind = atomic_load(&e->kind);
	out->in_shared_list = fdc_in_shared_list(t, fd);
	out->running_mask = atomic_load(&e->running_mask);
	out->thread_mask = atomic_load(&e->thread_mask);
	out->update_mask = atomic_load(&e->update_mask);
	out->polled_recv = atomic_load(&t->polled[fd].recv);
	out->polled_send = atomic_load(&t->polled[fd].send);
	out->polled_hup = atomic_load(&t->polled[fd].hup);
	out->owner = atomic_load(&e->owner);
	out->ctl_errno = atomic_load(&e->ctl_errno);
	return 0;
}

int fdc_in_shared_list(struct fdc_table *t, int fd)
{
	if (!fdc_fd_ok(t, fd))
		return 0;
	return fdc_lnext(atomic_load(&t->fdtab[fd].links)) >= FDC_LIST_END;
}
