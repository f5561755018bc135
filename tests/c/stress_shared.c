/* "shared" scenario: connections shared by every thread of a group
 * (fdc_insert_shared: EPOLLIN | EPOLLEXCLUSIVE | EPOLLET in each of their
 * pollers, EPOLLOUT too in the inserter's, registrations never narrowed),
 * handled the way worker/native/engine/dispatch.c does, under threads that are
 * preempted anywhere (issue 21).
 *
 * A few slots per thread, each holding one socketpair end inserted with
 * fdc_insert_shared by a random thread (for its whole group, or a random
 * subset with its own bit); the peer end stays with the test. Pollers loop
 * on fdc_poll with short timeouts (so some sleep in epoll_wait and the
 * kernel's one-sleeper hand-off is exercised) and, at random:
 *   - want_send / stop_send on a slot (no epoll_ctl, except a sibling's
 *     first pass with send wanted, which adds EPOLLOUT: DEL + ADD; waking
 *     nobody);
 *   - stop_recv, a pause, want_recv on a slot (reading paused: an arrival
 *     meanwhile is reported, not handed out, kept in the state, and must
 *     be replayed to the thread that wants recv again, FDC_KEPT_R);
 *   - delete a slot's connection and refill it at once (socketpair takes
 *     the lowest free numbers: the closed one comes back), sometimes with
 *     the peer closed first (a hang-up, reported to every waiter) and
 *     sometimes with bytes already waiting when it is inserted (every ADD
 *     reports them); deletes also come from inside a handler while other
 *     threads hold running bits (the last to leave closes).
 * Odd slots are deleted and refilled (which hides a report lost on them),
 * even ones live the whole run, and slots 0, 4, 8, ... see no send flips
 * (a sibling's first pass with send wanted ADDs, and an ADD reports what
 * is readable, which would also repair a lost report); their reading is
 * paused now and then instead. Send flips go to odd slots, and slots 2,
 * 6, 10, ... answer: a handler that read bytes there now and then writes a
 * response of RESP bytes, until EAGAIN, then (after a pause: preempted
 * there) wants send and goes on at each POLLOUT; the writer thread drains
 * those peers, and sends them nothing while a response is owed (the
 * report of an arrival says "writable" too, and would repair a lost one).
 * A writable edge that came between the EAGAIN and the want_send was
 * consumed while send was not wanted: only fdcore's replay (FDC_KEPT_W)
 * tells the handler, and without it the response stalls, which the writer
 * turns into FAIL "lost send report" (peer drained, response unfinished).
 * The handler makes that window itself, deterministically rather than by
 * a timed pause (which closed before a woken poller ran under load): a
 * sibling of the inserter waits for the inserter to enter epoll_wait (the
 * hook's FDC_HK_BEFORE_WAIT, g_run.waiting: an exclusive waiter asleep
 * takes the edge alone), drains the peer (the edge), then holds the window
 * until every other poller has passed (hold_window).
 * A writer thread (not a poller) sends numbered bytes on each peer, a new
 * burst only once everything sent before was read, so the last byte of a
 * burst is announced by one edge and nothing else: a report lost anywhere
 * (kernel hand-off, DEL + ADD, the protocol below) leaves bytes unread for
 * ever, which the writer turns into FAIL "lost report" after a delay
 * (a quarter of the watchdog's -d, at least 3 s).
 *
 * The handler, holding the running bit, is dispatch.c's protocol with a
 * mutex per incarnation in place of the GIL: under it, a thread finding
 * another thread `inside` the connection records the report (missed) and
 * leaves; else it marks itself inside, lets the mutex go, reads until a
 * short read (edge-triggered: nothing else will say that bytes still
 * wait), and before clearing `inside` replays what was recorded meanwhile.
 * Checks, besides common.c's (every report is the inserted incarnation,
 * held with the running bit; exactly one close per incarnation, none while
 * a handler is inside; at the quiescent points polled == the kernel's
 * interest lists, EPOLLET and EPOLLEXCLUSIVE included): bytes are read in
 * the order written, each once (a value out of sequence, or more read than
 * written), never by two readers at once; an end of input only after the
 * test closed the peer; every byte written read by the end.
 *
 * -x 1 (XS_CHAOS) lets common.c's chaos verbs run (off by default here):
 * a verb on a number whose fdc_insert_shared is still registering it
 * makes a sibling's update pass race that insert (the finding reproduced
 * deterministically by tests/c/repro/repro_shared_insert.c).
 * Built with -DSHARED_NO_REPLAY, the winner drops what losers recorded
 * instead of replaying it (tests/test_c_mutations.py: the stress must see
 * the lost report).
 */
#define _GNU_SOURCE
#include "common.h"

#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#define SLOTS_PER_THREAD 2     /* g_nslots even: delete_one, flip_send */
#define BURST 48
#define RESP (256 << 10)       /* a response: many times what the answering
                                  fd's send buffer (SNDBUF_ANSWER) holds */
#define SNDBUF_ANSWER 16384

struct slot {
	pthread_mutex_t mu;     /* orders the test's own uses of fd and peer */
	int live;               /* 0 while being deleted / refilled */
	int fd, peer;
	uint64_t cookie;
	uint64_t wrote;         /* bytes sent on peer (this incarnation) */
	double since;           /* when the oldest byte not yet read was sent */
	int send_on;
	int pausers;            /* threads pausing its reading: not deleted */
	uint64_t drained;       /* response bytes the writer read off peer */
	double out_since;       /* last progress of a response owed, or idle */
};

/* Per fd number, the incarnation's connection state (dispatch.c's struct conn
 * fields). Reset by the inserter before the insert; touched by handlers
 * only while they hold a running bit (which pins the incarnation). */
struct sconn {
	pthread_mutex_t mu;     /* the GIL's part: inside and missed */
	int inside;             /* tid of the thread handling it, -1 none */
	uint32_t missed;        /* FDC_POLL_* of reports others recorded */
	int dead;               /* deleted by the test: reports are stale */
	int slot;
	uint64_t cookie;
	_Atomic uint64_t readn; /* bytes read, in order */
	_Atomic int readers;    /* threads in read() on it: 0 or 1 */
	_Atomic int eof_ok;     /* the test closed the peer */
	_Atomic uint64_t owe;   /* response bytes not yet written (slots 2 mod 4) */
	_Atomic uint64_t wrote; /* response bytes written, in all */
	int send_on;            /* the handler wants send (inside only) */
	int inserter;           /* tid of the thread that inserted it */
};

static struct slot *g_slots;
static int g_nslots;
static struct sconn *g_conn;
static double g_lost_after = 3.0;
static _Atomic int g_writer_done;
static _Atomic uint64_t g_reports, g_missed, g_replays, g_dead_reports, g_bytes, g_reads;
static _Atomic uint64_t g_bursts, g_deletes, g_hdeletes, g_prefilled, g_sendflips, g_outs;
static _Atomic uint64_t g_eofs, g_hup_first, g_subset;
static _Atomic uint64_t g_pauses, g_resps, g_eagains, g_resp_outs, g_windows, g_ctl_reports;

/* Per poller (tid), its fdc_poll calls begun and ended (odd: inside one),
 * and whether it holds an EAGAIN window open (hold_window). */
static _Atomic uint64_t g_polls[MAX_THREADS];
static _Atomic int g_in_window[MAX_THREADS];

static void lock(pthread_mutex_t *m) { CHECK(pthread_mutex_lock(m) == 0, "lock"); }
static void unlock(pthread_mutex_t *m) { CHECK(pthread_mutex_unlock(m) == 0, "unlock"); }

/* the value of byte i of an incarnation */
static uint8_t byte_at(uint64_t cookie, uint64_t i)
{
	return (uint8_t)(i * 131 + (cookie >> COOKIE_FDBITS) * 7 + 1);
}

static void send_burst(struct slot *s, uint64_t n)
{
	uint8_t b[BURST];

	for (uint64_t i = 0; i < n; i++)
		b[i] = byte_at(s->cookie, s->wrote + i);
	/* counted before the write: a reader may see the bytes at once */
	s->wrote += n;
	ssize_t k = send(s->peer, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	/* everything sent before was read: the buffer is empty */
	CHECKFD(s->fd, k == (ssize_t)n, "send %llu bytes to the peer of fd %d: %zd (%s)",
	        (unsigned long long)n, s->fd, k, k < 0 ? strerror(errno) : "short");
	atomic_fetch_add_explicit(&g_bursts, 1, memory_order_relaxed);
}

/* Inserts a fresh socketpair end into a slot nobody else may touch
 * (live == 0), shared by th's group (or a subset with th's bit), as a
 * worker's accept does. */
static void slot_fill(struct fdc_thread *th, struct slot *s)
{
	struct fdc_table *t = g_run.t;
	uint64_t en = t->groups[th->tgid].enabled_mask, mask = en;
	int sv[2], pick = (int)rndn(2);

	SYS(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv));
	int fd = sv[pick], peer = sv[!pick];
	CHECK(fd < g_run.maxfd, "fd %d beyond the table", fd);
	if ((s - g_slots) % 4 == 2) {
		int sz = SNDBUF_ANSWER;   /* a response hits EAGAIN many times */
		SYS(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz)));
	}
	if (chance(4)) {
		mask = (rnd() & en) | th->ltid_bit;
		atomic_fetch_add_explicit(&g_subset, 1, memory_order_relaxed);
	}
	/* the record the handlers of this incarnation will use: before the
	 * insert, since any owner's poller may report it from the first ADD */
	struct fdrec *r = &g_rec[fd];
	struct sconn *c = &g_conn[fd];
	CHECKFD(fd, atomic_load(&r->live) == 0, "fd %d reused while its incarnation is live", fd);
	uint64_t cookie = (atomic_fetch_add(&g_run.serial, 1) + 1) << COOKIE_FDBITS | (uint64_t)fd;
	uint32_t gen = atomic_load(&t->fdtab[fd].generation);
	lock(&c->mu);
	c->inside = -1;
	c->missed = 0;
	c->dead = 0;
	c->slot = (int)(s - g_slots);
	c->inserter = th->tid;
	c->cookie = cookie;
	atomic_store(&c->readn, 0);
	atomic_store(&c->readers, 0);
	atomic_store(&c->eof_ok, 0);
	atomic_store(&c->owe, 0);
	atomic_store(&c->wrote, 0);
	c->send_on = 0;
	unlock(&c->mu);
	s->fd = fd;
	s->peer = peer;
	s->cookie = cookie;
	s->wrote = 0;
	s->send_on = 0;
	s->drained = 0;
	s->since = s->out_since = now_s();
	/* (not once the run is over: -e deletes and refills then too, and
	 * the pollers stop once all is read) */
	if (!atomic_load(&g_run.stop) && chance(4)) {
		/* a client whose request is there before the registrations */
		send_burst(s, 1 + rndn(BURST));
		atomic_fetch_add_explicit(&g_prefilled, 1, memory_order_relaxed);
	}
	atomic_store(&g_ctlfail[fd], 0);
	atomic_store(&g_ctltold[fd], 0);
	atomic_store(&r->cookie, cookie);
	atomic_store(&r->gen, gen);
	atomic_store(&r->kind, KIND_CONN);
	atomic_store(&r->live, 1);
	int rc = fdc_insert_shared(th, fd, cookie, KIND_CONN, mask);
	CHECKFD(fd, rc == 0, "fdc_insert_shared(fd %d, mask %#llx): %s", fd,
	        (unsigned long long)mask, strerror(-rc));
	atomic_fetch_add(&g_run.inserts, 1);

	struct fdc_fdinfo fi;
	CHECKFD(fd, fdc_dump(t, fd, &fi) >= 0, "dump");
	CHECKFD(fd, fi.owner == cookie && fi.generation == gen && fi.tgid == (uint32_t)th->tgid &&
	            fi.thread_mask == (mask & en) && fi.kind == KIND_CONN,
	        "after insert_shared: owner %#llx gen %u tgid %u mask %#llx kind %u", 
	        (unsigned long long)fi.owner, fi.generation, fi.tgid,
	        (unsigned long long)fi.thread_mask, fi.kind);
	CHECKFD(fd, (fi.state & (FDC_EDGE | FDC_EXCLUSIVE | FDC_ACTIVE_R)) ==
	                (FDC_EDGE | FDC_EXCLUSIVE | FDC_ACTIVE_R),
	        "after insert_shared: state %#x", fi.state);
	lock(&s->mu);
	s->live = 1;
	unlock(&s->mu);
}

/* Takes a live slot (of incarnation `cookie`, or any if 0) out of the
 * writer's and the other threads' reach; its connection is then marked
 * dead for the handlers. Returns 0 if it was not there to take. */
static int slot_claim(struct slot *s, uint64_t cookie)
{
	int got = 0;

	lock(&s->mu);
	if (s->live && !s->pausers && (!cookie || s->cookie == cookie)) {
		s->live = 0;
		got = 1;
	}
	unlock(&s->mu);
	if (got) {
		struct sconn *c = &g_conn[s->fd];
		lock(&c->mu);
		c->dead = 1;
		unlock(&c->mu);
	}
	return got;
}

/* Deletes a claimed slot's connection (the caller holds no running bit on
 * it unless `held`, then the caller's bit goes with the delete) and fills
 * the slot again. */
static void slot_recycle(struct fdc_thread *th, struct slot *s)
{
	int fd = s->fd;

	if (chance(3)) {
		/* peer first: a hang-up while every owner still polls it */
		atomic_store(&g_conn[fd].eof_ok, 1);
		SYS(close(s->peer));
		s->peer = -1;
		atomic_fetch_add_explicit(&g_hup_first, 1, memory_order_relaxed);
	}
	tst_delete(th, fd, s->cookie);
	if (s->peer >= 0) {
		/* a handler may still be inside (the close waits for it) */
		atomic_store(&g_conn[fd].eof_ok, 1);
		SYS(close(s->peer));
	}
	slot_fill(th, s);
}

/* Reads fd until a short read (the edge is spent), checking the bytes. */
static void read_all(struct fdc_thread *th, struct sconn *c, int fd)
{
	uint8_t b[64];

	CHECKFD(fd, atomic_fetch_add(&c->readers, 1) == 0,
	        "two threads read fd %d at once (the `inside` protocol let two handlers in)", fd);
	for (;;) {
		size_t room = 1 + rndn(sizeof(b));
		ssize_t n = read(fd, b, room);

		atomic_fetch_add_explicit(&g_reads, 1, memory_order_relaxed);
		if (n > 0) {
			uint64_t at = atomic_load(&c->readn);
			for (ssize_t i = 0; i < n; i++)
				CHECKFD(fd, b[i] == byte_at(c->cookie, at + (uint64_t)i),
				        "fd %d byte %llu is %u, expected %u: lost, duplicated or reordered",
				        fd, (unsigned long long)(at + (uint64_t)i), b[i],
				        byte_at(c->cookie, at + (uint64_t)i));
			atomic_store(&c->readn, at + (uint64_t)n);
			atomic_fetch_add_explicit(&g_bytes, (uint64_t)n, memory_order_relaxed);
			if ((size_t)n < room)
				break;
			if (chance(16))
				sched_yield();   /* bytes arrive while we are inside */
			continue;
		}
		if (n == 0) {
			CHECKFD(fd, atomic_load(&c->eof_ok), "end of input on fd %d, peer still open", fd);
			atomic_fetch_add_explicit(&g_eofs, 1, memory_order_relaxed);
			break;
		}
		if (errno == EAGAIN) {
			int rc = fdc_cant_recv(th, fd);
			CHECKFD(fd, rc >= 0, "cant_recv: %s", strerror(-rc));
			break;
		}
		FAILFD(fd, "read fd %d: %s", fd, strerror(errno));
	}
	CHECKFD(fd, atomic_fetch_sub(&c->readers, 1) == 1, "reader count");
}

/* Reads what an answering connection wrote off its peer, and fails if a
 * response stays unfinished with nothing to read for the lost-report
 * delay: its POLLOUT never came. The writer's, or a handler's in its
 * EAGAIN window; under the slot's lock. */
static void drain_peer(struct slot *s, struct sconn *c, double now)
{
	uint8_t buf[32768];
	ssize_t n;
	int got = 0;

	while ((n = recv(s->peer, buf, sizeof(buf), MSG_DONTWAIT)) > 0) {
		s->drained += (uint64_t)n;
		got = 1;
	}
	if (got) {
		s->out_since = now;
		return;
	}
	CHECKFD(s->fd, n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
	        "recv on the peer of fd %d: %zd (%s)", s->fd, n, n < 0 ? strerror(errno) : "EOF");
	if (!atomic_load(&c->owe))
		s->out_since = now;
	else if (now - s->out_since > g_lost_after)
		FAILFD(s->fd, "lost send report: fd %d owes %llu bytes of its response, its peer"
		       " drained all %llu written %.1f s ago (inside %d missed %#x)", s->fd,
		       (unsigned long long)atomic_load(&c->owe), (unsigned long long)s->drained,
		       now - s->out_since, c->inside, c->missed);
}

/* Holds the window between an EAGAIN and want_send open until the writable
 * edge the drain just caused has been taken: every other poller has ended
 * an fdc_poll begun after the drain (one asleep in epoll_wait wakes on the
 * edge, one busy meets it at its next call); a poller
 * holding a window of its own is not waited for (it polls nothing, and two
 * windows would wait on each other). Bounded by 50 ms: a longer hold slowed
 * the whole stress (shared-no-replay, caught by its pace, was missed). The timed pause that was here (100 to
 * 500 us) closed before a poller woken under load ran: the mutant that
 * drops a send edge taken while send is not ACTIVE survived 60 s twice at
 * load 24-37. Now the edge is taken inside the window whenever a poller
 * with EPOLLOUT registered is not the handler itself. */
static void hold_window(int me)
{
	uint64_t until[MAX_THREADS];
	int n = g_run.t->nbthread;
	double t0 = now_s();

	atomic_store(&g_in_window[me], 1);
	for (int i = 0; i < n; i++) {
		uint64_t p = atomic_load(&g_polls[i]);
		/* outside a call: the next one's end; inside one: its end may
		 * come before the edge (past its epoll_wait): the next one's */
		until[i] = p + (p & 1 ? 3 : 2);
	}
	for (;;) {
		int done = 1;

		for (int i = 0; i < n && done; i++)
			if (i != me && !atomic_load(&g_in_window[i]) && atomic_load(&g_polls[i]) < until[i])
				done = 0;
		if (done || now_s() - t0 > 0.05 || atomic_load(&g_run.stop))
			break;
		usleep(50);
	}
	atomic_store(&g_in_window[me], 0);
}

/* Writes what c's response still owes until done or EAGAIN, by the thread
 * inside. On EAGAIN, after a pause now and then (a writable edge may come
 * and be consumed right there, send not yet wanted), wants send: the
 * POLLOUT that goes on must come, replayed if the edge came in the pause. */
static void write_owed(struct fdc_thread *th, struct sconn *c, int fd)
{
	static const uint8_t zeros[16384];

	while (atomic_load(&c->owe)) {
		uint64_t owe = atomic_load(&c->owe);
		/* MSG_NOSIGNAL: a peer gone (a mutant's lost report) is a FAIL
		 * below, not a SIGPIPE that kills the run without a report */
		ssize_t n = send(fd, zeros, owe < sizeof(zeros) ? owe : sizeof(zeros),
		                 MSG_NOSIGNAL);

		if (n > 0) {
			atomic_store(&c->owe, owe - (uint64_t)n);
			atomic_fetch_add(&c->wrote, (uint64_t)n);
			if (c->send_on && chance(4)) {
				/* send off again while writing: the next EAGAIN opens
				 * a window of its own (a few per response) */
				int rc = fdc_stop_send(th, fd);
				CHECKFD(fd, rc >= 0, "stop_send: %s", strerror(-rc));
				c->send_on = 0;
			}
			continue;
		}
		CHECKFD(fd, n < 0 && errno == EAGAIN, "write fd %d: %zd (%s)", fd, n,
		        n < 0 ? strerror(errno) : "0");
		atomic_fetch_add_explicit(&g_eagains, 1, memory_order_relaxed);
		if (!c->send_on) {
			/* a sibling's EAGAIN: the edge goes to the inserter's poller
			 * first (its registration is first in the fd's wait queue),
			 * asleep or not, never to this handler: always the window */
			if (th->tid != c->inserter || chance(2)) {
				/* the peer reads now: the writable edge comes here,
				 * and a poller asleep takes it, send not yet wanted.
				 * The inserter's asleep in epoll_wait wakes alone (an
				 * exclusive waiter: the edge goes to no other ready
				 * list, this handler's included): a sibling's window
				 * waits a little for the inserter to be there */
				struct slot *s = &g_slots[c->slot];

				int sibling = th->tid != c->inserter;

				for (int i = 0; sibling && i < 250 && !atomic_load(&g_run.waiting[c->inserter]); i++)
					usleep(20);

				lock(&s->mu);
				drain_peer(s, c, now_s());
				unlock(&s->mu);
				atomic_fetch_add_explicit(&g_windows, 1, memory_order_relaxed);
				/* the inserter's own window cannot lose the edge (it
				 * is in its ready list too): a short pause, which
				 * keeps the stress's pace */
				if (sibling)
					hold_window(th->tid);  /* for a poller to take the edge */
				else
					usleep(100 + rndn(400));
			}
			else if (chance(2))
				sched_yield();
			int rc = fdc_want_send(th, fd);
			CHECKFD(fd, rc >= 0, "want_send: %s", strerror(-rc));
			c->send_on = 1;
		}
		return;
	}
	if (c->send_on) {
		int rc = fdc_stop_send(th, fd);
		CHECKFD(fd, rc >= 0, "stop_send: %s", strerror(-rc));
		c->send_on = 0;
	}
}

/* One report's work, by the thread inside. Returns 1 if it tells of a
 * failed registration (FDC_POLL_CTL, -e): the connection is then deleted
 * once the replays are done, as a worker closes it. */
static int serve(struct fdc_thread *th, struct sconn *c, int fd, uint32_t events)
{
	int answers = c->slot % 4 == 2;

	if (events & FDC_POLL_CTL) {
		ctl_told(fd);
		atomic_fetch_add_explicit(&g_ctl_reports, 1, memory_order_relaxed);
		return 1;
	}

	if (events & (FDC_POLL_IN | FDC_POLL_HUP | FDC_POLL_ERR | FDC_POLL_RDHUP))
		read_all(th, c, fd);
	if (answers) {
		/* a request read: a response now and then, one at a time */
		if ((events & FDC_POLL_IN) && !atomic_load(&c->owe) && chance(4) &&
		    !atomic_load(&g_run.stop)) {
			atomic_store(&c->owe, RESP);
			atomic_fetch_add_explicit(&g_resps, 1, memory_order_relaxed);
		}
		if (events & FDC_POLL_OUT)
			atomic_fetch_add_explicit(&g_resp_outs, 1, memory_order_relaxed);
		write_owed(th, c, fd);
	}
	else if (events & FDC_POLL_OUT) {
		/* a response flushed: send no longer wanted, now and then */
		atomic_fetch_add_explicit(&g_outs, 1, memory_order_relaxed);
		if (chance(2)) {
			int rc = fdc_stop_send(th, fd);
			CHECKFD(fd, rc >= 0, "stop_send: %s", strerror(-rc));
		}
	}
	/* stay inside a while, as the app call does: the writer sees
	 * everything read and sends, and the edge goes to another thread */
	if (chance(4))
		sched_yield();
	else if (chance(8))
		usleep(50 + rndn(400));
	return 0;
}

/* Claims the slot of incarnation `cookie` for a delete, waiting out the
 * threads that pause its reading (they need nothing of ours). 0 if it is
 * not there to take (another thread deletes it). */
static int slot_claim_wait(struct slot *s, uint64_t cookie)
{
	for (;;) {
		lock(&s->mu);
		if (!s->live || s->cookie != cookie) {
			unlock(&s->mu);
			return 0;
		}
		if (!s->pausers) {
			unlock(&s->mu);
			return slot_claim(s, cookie);
		}
		unlock(&s->mu);
		sched_yield();
	}
}

/* The handler: th holds a running bit on ev->fd (fdc_poll). */
static void handle(struct fdc_thread *th, struct fdc_event *ev)
{
	int fd = ev->fd, tid = th->tid;
	struct sconn *c = &g_conn[fd];
	uint32_t events = ev->events;

	check_event(th, ev);
	atomic_fetch_add(&g_inside[fd], 1);
	atomic_fetch_add_explicit(&g_reports, 1, memory_order_relaxed);
	lock(&c->mu);
	CHECKFD(fd, c->cookie == ev->owner,
	        "report for incarnation %#llx, the test's record is %#llx",
	        (unsigned long long)ev->owner, (unsigned long long)c->cookie);
	if (c->dead) {
		/* deleted, its close deferred to the last runner */
		unlock(&c->mu);
		atomic_fetch_add_explicit(&g_dead_reports, 1, memory_order_relaxed);
		goto leave;
	}
	if (c->inside >= 0) {
		/* another thread handles it: it replays this before letting go */
		CHECKFD(fd, c->inside != tid, "tid %d reported fd %d while inside it", tid, fd);
		c->missed |= events;
		unlock(&c->mu);
		atomic_fetch_add_explicit(&g_missed, 1, memory_order_relaxed);
		goto leave;
	}
	c->inside = tid;
	unlock(&c->mu);

	int failed = 0;
	for (;;) {
		failed |= serve(th, c, fd, events);
		lock(&c->mu);
#ifndef SHARED_NO_REPLAY
		if (c->missed) {
			events = c->missed;
			c->missed = 0;
			unlock(&c->mu);
			atomic_fetch_add_explicit(&g_replays, 1, memory_order_relaxed);
			continue;
		}
#else
		c->missed = 0;
#endif
		c->inside = -1;
		unlock(&c->mu);
		break;
	}

	/* now and then the connection ends from its handler, other threads
	 * possibly holding running bits (the last one out closes); always
	 * after a failed registration */
	struct slot *s = &g_slots[c->slot];
	if (failed ? slot_claim_wait(s, ev->owner) :
	    c->slot % 2 && chance(64) && !atomic_load(&g_run.stop) && slot_claim(s, ev->owner)) {
		atomic_fetch_sub(&g_inside[fd], 1);   /* the delete drops our running bit */
		atomic_fetch_add(&g_hdeletes, 1);
		slot_recycle(th, s);
		tst_leave(th, ev);
		return;
	}
leave:
	atomic_fetch_sub(&g_inside[fd], 1);
	tst_leave(th, ev);
}

static void poll_once(struct fdc_thread *th, int timeout)
{
	struct fdc_event evs[16];
	int k;

	nomem_point(th);
	atomic_fetch_add(&g_polls[th->tid], 1);
	k = fdc_poll(th, timeout, evs, 16);
	atomic_store(&g_run.waiting[th->tid], 0);
	atomic_fetch_add(&g_polls[th->tid], 1);   /* its reports applied (hold_window) */

	CHECK(k >= 0, "fdc_poll: %s", strerror(-k));
	for (int i = 0; i < k; i++)
		handle(th, &evs[i]);
}

/* want/stop send on an odd slot (slots 2 mod 4 answer: their send is the
 * handler's own); slots 0, 4, ... see nothing but arrivals. */
static void flip_send(struct fdc_thread *th)
{
	struct slot *s = &g_slots[rndn((unsigned)g_nslots) | 1];

	lock(&s->mu);
	if (s->live) {
		int on = chance(2);
		int rc = on ? fdc_want_send(th, s->fd) : fdc_stop_send(th, s->fd);
		CHECKFD(s->fd, rc >= 0, "want/stop_send: %s", strerror(-rc));
		atomic_fetch_add_explicit(&g_sendflips, 1, memory_order_relaxed);
	}
	unlock(&s->mu);
}

/* Pauses the reading of a slot 0 (mod 4) for a while, then resumes it:
 * what arrives meanwhile is kept by fdcore and must be replayed to us at
 * want_recv (our next poll reports it). The slot cannot be deleted
 * meanwhile (pausers; it is even: it never is), and the writer goes on
 * sending to it. */
static void pause_recv(struct fdc_thread *th)
{
	struct slot *s = &g_slots[rndn((unsigned)g_nslots) & ~3u];
	int fd = -1, rc;

	lock(&s->mu);
	if (s->live) {
		s->pausers++;
		fd = s->fd;
	}
	unlock(&s->mu);
	if (fd < 0)
		return;
	rc = fdc_stop_recv(th, fd);
	CHECKFD(fd, rc >= 0, "stop_recv: %s", strerror(-rc));
	if (chance(2))
		sched_yield();
	else
		usleep(50 + rndn(400));            /* a burst may arrive in here */
	rc = fdc_want_recv(th, fd);
	CHECKFD(fd, rc >= 0, "want_recv: %s", strerror(-rc));
	atomic_fetch_add_explicit(&g_pauses, 1, memory_order_relaxed);
	lock(&s->mu);
	s->pausers--;
	unlock(&s->mu);
}

/* Deletes and refills an odd slot: even ones live the whole run, long
 * enough for a report lost on them to be seen. */
static void delete_one(struct fdc_thread *th)
{
	struct slot *s = &g_slots[rndn((unsigned)g_nslots) | 1];

	if (!slot_claim(s, 0))
		return;
	atomic_fetch_add(&g_deletes, 1);
	slot_recycle(th, s);
}

/* Whether every byte written on live slots was read. */
static int all_read(void)
{
	for (int i = 0; i < g_nslots; i++) {
		struct slot *s = &g_slots[i];
		lock(&s->mu);
		int done = !s->live || atomic_load(&g_conn[s->fd].readn) == s->wrote;
		unlock(&s->mu);
		if (!done)
			return 0;
	}
	return 1;
}

static void *shared_worker(void *arg)
{
	int tid = (int)(intptr_t)arg;
	struct fdc_thread *th = fdc_thread(g_run.t, tid);

	seed_thread(tid);
	while (worker_continue(th, 0)) {
		unsigned r = rndn(64);
		if (r < 6)
			flip_send(th);
		else if (r == 6 && !atomic_load(&g_run.stop))
			delete_one(th);
		else if (r < 10)
			pause_recv(th);
		/* mostly short sleeps: the kernel hands each edge to a sleeper */
		poll_once(th, chance(4) ? 0 : 1 + (int)rndn(3));
	}
	/* the writer stops with the run; what it wrote must all be read (no
	 * deletes from now on: a refill's first bytes would come back after
	 * some threads stopped polling) */
	double t0 = now_s();
	while (!atomic_load(&g_writer_done) || !all_read()) {
		tick(tid);
		CHECK(now_s() - t0 < g_lost_after + 2,
		      "lost report: bytes left unread %.1f s after the run", now_s() - t0);
		poll_once(th, 5);
	}
	quiescent_point(th, 0);
	return NULL;
}

/* The writer: a burst on each idle connection, and the lost-report check
 * on the others. */
static void *writer(void *arg)
{
	(void)arg;
	seed_thread(999);
	while (!atomic_load(&g_run.stop)) {
		double now = now_s();
		for (int i = 0; i < g_nslots; i++) {
			struct slot *s = &g_slots[i];
			lock(&s->mu);
			if (s->live) {
				struct sconn *c = &g_conn[s->fd];
				uint64_t rd = atomic_load(&c->readn);
				CHECKFD(s->fd, rd <= s->wrote, "fd %d: %llu bytes read, %llu written", s->fd,
				        (unsigned long long)rd, (unsigned long long)s->wrote);
				if (i % 4 == 2)
					drain_peer(s, c, now);
				if (rd == s->wrote) {
					s->since = now;
					if (chance(2) && !(i % 4 == 2 && atomic_load(&c->owe)))
						send_burst(s, 1 + rndn(BURST));
				} else if (now - s->since > g_lost_after) {
					FAILFD(s->fd, "lost report: fd %d has %llu of %llu bytes read, the last"
					       " burst sent %.1f s ago and nobody reads it (inside %d missed %#x)",
					       s->fd, (unsigned long long)rd, (unsigned long long)s->wrote,
					       now - s->since, c->inside, c->missed);
				}
			}
			unlock(&s->mu);
		}
		usleep(rndn(200));   /* pacing, not a wait for anything */
	}
	atomic_store(&g_writer_done, 1);
	return NULL;
}

int run_shared(void)
{
	struct fdc_table *t;
	char extra[512];

	/* chaos verbs name numbers at random, so also a connection whose
	 * fdc_insert_shared is still registering it: the finding of -x 1
	 * (tests/c/repro/repro_shared_insert.c) */
	if (!(g_opt.extended & XS_CHAOS))
		g_opt.chaos = 0;
	run_init();
	t = g_run.t;
	/* the quiescent points stop the pollers for a while: not a loss */
	g_lost_after = g_opt.watchdog / 4 > 3 ? g_opt.watchdog / 4 : 3;
	g_conn = calloc((size_t)g_run.maxfd, sizeof(*g_conn));
	CHECK(g_conn != NULL, "calloc");
	for (int fd = 0; fd < g_run.maxfd; fd++)
		CHECK(pthread_mutex_init(&g_conn[fd].mu, NULL) == 0, "mutex");
	g_nslots = SLOTS_PER_THREAD * t->nbthread;
	g_slots = calloc((size_t)g_nslots, sizeof(*g_slots));
	CHECK(g_slots != NULL, "calloc");
	seed_thread(1000);
	for (int i = 0; i < g_nslots; i++) {
		CHECK(pthread_mutex_init(&g_slots[i].mu, NULL) == 0, "mutex");
		/* inserted by a thread of each group in turn */
		slot_fill(fdc_thread(t, (int)rndn((unsigned)t->nbthread)), &g_slots[i]);
	}
	double el = run_threads(shared_worker, writer);

	snprintf(extra, sizeof(extra),
	         "busy=%d reports=%llu missed=%llu replays=%llu dead_reports=%llu bytes=%llu reads=%llu"
	         " bursts=%llu deletes=%llu handler_deletes=%llu prefilled=%llu subset=%llu"
	         " sendflips=%llu outs=%llu hup_first=%llu eofs=%llu pauses=%llu resps=%llu"
	         " eagains=%llu resp_outs=%llu windows=%llu nomem_fails=%llu epfail=%llu"
	         " ctl_reports=%llu lost_after=%.1f%s",
	         g_opt.busy, (unsigned long long)g_reports, (unsigned long long)g_missed,
	         (unsigned long long)g_replays, (unsigned long long)g_dead_reports,
	         (unsigned long long)g_bytes, (unsigned long long)g_reads,
	         (unsigned long long)g_bursts, (unsigned long long)g_deletes,
	         (unsigned long long)g_hdeletes, (unsigned long long)g_prefilled,
	         (unsigned long long)g_subset, (unsigned long long)g_sendflips,
	         (unsigned long long)g_outs, (unsigned long long)g_hup_first,
	         (unsigned long long)g_eofs, (unsigned long long)g_pauses,
	         (unsigned long long)g_resps, (unsigned long long)g_eagains,
	         (unsigned long long)g_resp_outs, (unsigned long long)g_windows,
	         (unsigned long long)atomic_load(&g_nomem_fails),
	         (unsigned long long)atomic_load(&g_epfail_fails),
	         (unsigned long long)atomic_load(&g_ctl_reports), g_lost_after,
#ifdef SHARED_NO_REPLAY
	         " NO_REPLAY"
#else
	         ""
#endif
	);
	print_counters("shared", el, extra);
	CHECK(atomic_load(&g_bytes) > 0, "nothing read");

	/* no thread polls any more: each delete closes at once */
	for (int i = 0; i < g_nslots; i++) {
		struct slot *s = &g_slots[i];
		CHECK(s->live, "slot %d left half-deleted", i);
		CHECK(tst_delete(fdc_thread(t, 0), s->fd, s->cookie) == 1, "idle delete deferred");
		SYS(close(s->peer));
		pthread_mutex_destroy(&s->mu);
	}
	free(g_slots);
	run_fini();
	for (int fd = 0; fd < g_run.maxfd; fd++)
		pthread_mutex_destroy(&g_conn[fd].mu);
	free(g_conn);
	return 0;
}
