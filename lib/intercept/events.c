/* SPDX-License-Identifier: MIT */
/*
 * The free-event ring and the table of frees in flight (events.h). Ring producers are the hooks of
 * the driver's free and allocation functions, on any thread, possibly many at once: a producer
 * reserves a number with one fetch-add on `head`, claims its slot (the slot's sequence, marked
 * WRITING, by compare-and-swap), writes it, then publishes the slot's sequence. Consumers (caches,
 * under their own lock) read a slot whose sequence is theirs, then check that no producer has
 * claimed it since. A producer delayed between its fetch-add and its claim for a whole lap finds
 * the slot a later lap's (its event is overwritten: head shows it) or being written by another
 * (it gives its event up and says so in `lost`): it never writes over a later lap's event.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#include "intercept/events.h"

struct slot {
	/* number of the event stored + 1, | WRITING while its producer writes; 0: never written */
	uint64_t seq;
	uint64_t start, len;
	uint32_t kind;
};

/* The head, alone on its line: every hit reads it (events.h), producers write it. */
struct gdr_events_head_line gdr_events_head_line;
#define HEAD gdr_events_head_line.head
#define WRITING (1ull << 63) /* in a slot's seq: claimed, being written (numbers stay below) */

/* Events below this number may have been given up by their producers (see above). */
static uint64_t lost;

void (*gdr_events_push_hook)(int where, uint64_t n);

static struct {
	struct slot ring[GDR_EVENTS_RING] __attribute__((aligned(64)));
} ev;

/* The event this thread is publishing, plus one (0: none): a consumer on this thread (a signal
 * handler that interrupted the push, exit() from one and the program's clean-up at exit) must not
 * wait for it (gdr_events_give_up). */
static __thread uint64_t publishing __attribute__((tls_model("initial-exec")));

/* Events below n + 1 may have been given up (see above). */
static void lost_up_to(uint64_t n)
{
	uint64_t l = __atomic_load_n(&lost, __ATOMIC_RELAXED);

	while (l < n + 1 && !__atomic_compare_exchange_n(&lost, &l, n + 1, false, __ATOMIC_SEQ_CST,
							 __ATOMIC_RELAXED))
		;
}

void gdr_events_push_kind(uint32_t kind, uint64_t start, uint64_t len)
{
	uint64_t n = __atomic_fetch_add(&HEAD, 1, __ATOMIC_ACQ_REL);
	struct slot *s = &ev.ring[n & (GDR_EVENTS_RING - 1)];
	uint64_t q = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE), outer = publishing;

	__atomic_store_n(&publishing, n + 1, __ATOMIC_RELAXED);
	__atomic_signal_fence(__ATOMIC_SEQ_CST); /* before a signal handler can see the slot */
	if (gdr_events_push_hook)
		gdr_events_push_hook(0, n);
	do {
		if (q & WRITING || q > n) {
			/* Another producer's, a lap later or still writing an earlier one: ours is
			 * given up, and consumers are told (a later lap's already shows in head). */
			lost_up_to(n);
			publishing = outer;
			return;
		}
	} while (!__atomic_compare_exchange_n(&s->seq, &q, (n + 1) | WRITING, false,
					      __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE));
	/* Release stores after the claim: a consumer that reads any of them also sees the claim
	 * when it reads seq again (see below). */
	__atomic_store_n(&s->start, start, __ATOMIC_RELEASE);
	__atomic_store_n(&s->len, len, __ATOMIC_RELEASE);
	__atomic_store_n(&s->kind, kind, __ATOMIC_RELEASE);
	if (gdr_events_push_hook)
		gdr_events_push_hook(1, n);
	__atomic_store_n(&s->seq, n + 1, __ATOMIC_RELEASE);
	__atomic_signal_fence(__ATOMIC_SEQ_CST);
	publishing = outer; /* a push from a handler that interrupted this one: that one's again */
}

bool gdr_events_give_up(uint64_t seq, bool waited_long)
{
	uint64_t p = __atomic_load_n(&publishing, __ATOMIC_RELAXED);

	if (!waited_long && p != seq + 1)
		return false;
	lost_up_to(seq);
	return true;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int gdr_events_get_wait(uint64_t seq, struct gdr_event *out, bool *gave_up)
{
	uint64_t t0 = 0;
	unsigned tries = 0;
	int rc;

	*gave_up = false;
	while ((rc = gdr_events_get(seq, out)) == -EAGAIN) {
		if (++tries % 1024 == 1) { /* the clock now and then: this thread's at once */
			uint64_t now = mono_ns();

			t0 = tries == 1 ? now : t0;
			if (gdr_events_give_up(seq, now - t0 > 1000000000u)) {
				*gave_up = true;
				return -ERANGE;
			}
		}
		sched_yield();
	}
	return rc;
}

void gdr_events_push(uint64_t start, uint64_t len)
{
	gdr_events_push_kind(GDR_EV_FREE, start, len);
}

int gdr_events_get(uint64_t seq, struct gdr_event *out)
{
	struct slot *s = &ev.ring[seq & (GDR_EVENTS_RING - 1)];
	uint64_t q = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);

	if (q != seq + 1) {
		if ((q & ~WRITING) > seq + 1 || gdr_events_head() - seq > GDR_EVENTS_RING)
			return -ERANGE;         /* a later lap's */
		if (q == ((seq + 1) | WRITING)) /* its producer is writing it (or gave it up) */
			return __atomic_load_n(&lost, __ATOMIC_SEQ_CST) > seq ? -ERANGE : -EAGAIN;
		/* Not claimed for seq yet: its producer is about to, or gave it up. */
		return __atomic_load_n(&lost, __ATOMIC_SEQ_CST) > seq ? -ERANGE : -EAGAIN;
	}
	out->start = __atomic_load_n(&s->start, __ATOMIC_ACQUIRE);
	out->len = __atomic_load_n(&s->len, __ATOMIC_ACQUIRE);
	out->kind = __atomic_load_n(&s->kind, __ATOMIC_ACQUIRE);
	/* Claimed again since (a slot's number only grows): if what was read is a later producer's,
	 * seq shows its claim. */
	if (__atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) != seq + 1 ||
	    gdr_events_head() - seq > GDR_EVENTS_RING)
		return -ERANGE;
	return 0;
}

/* ---- Frees in flight ---------------------------------------------------------------------------
 * A slot is claimed (state 1) by compare-and-swap, filled, then published (state 2); a reader that
 * finds a slot claimed but not yet published cannot know its range and takes it as "everything".
 * When every slot is taken the free counts in `overflow`, which also means "everything". All
 * accesses are sequentially consistent: a registration's check (a load) after it classified
 * memory must see a free announced (a store) before that free reached the driver. */

enum { IF_FREE = 0, IF_CLAIMED = 1, IF_PUBLISHED = 2 };

static struct {
	uint32_t state;
	uint64_t start, len;
} inflight[GDR_INFLIGHT_SLOTS];
static uint32_t overflow;
static uint32_t busy; /* frees between _begin and _end: a reader that finds none reads no slot */

int gdr_events_free_begin(uint64_t start, uint64_t len)
{
	__atomic_add_fetch(&busy, 1, __ATOMIC_SEQ_CST); /* before the slot, cleared after it */
	for (unsigned i = 0; i < GDR_INFLIGHT_SLOTS; i++) {
		uint32_t st = IF_FREE;

		if (__atomic_load_n(&inflight[i].state, __ATOMIC_RELAXED) != IF_FREE ||
		    !__atomic_compare_exchange_n(&inflight[i].state, &st, IF_CLAIMED, false,
						 __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
			continue;
		__atomic_store_n(&inflight[i].start, start, __ATOMIC_SEQ_CST);
		__atomic_store_n(&inflight[i].len, len, __ATOMIC_SEQ_CST);
		__atomic_store_n(&inflight[i].state, IF_PUBLISHED, __ATOMIC_SEQ_CST);
		return (int)i;
	}
	__atomic_add_fetch(&overflow, 1, __ATOMIC_SEQ_CST);
	return -1;
}

void gdr_events_free_end(int token)
{
	if (token < 0)
		__atomic_sub_fetch(&overflow, 1, __ATOMIC_SEQ_CST);
	else
		__atomic_store_n(&inflight[token].state, IF_FREE, __ATOMIC_SEQ_CST);
	__atomic_sub_fetch(&busy, 1, __ATOMIC_SEQ_CST);
}

bool gdr_events_inflight(bool (*overlaps)(uint64_t start, uint64_t len, const void *arg),
			 const void *arg)
{
	struct gdr_inflight_snap s;

	gdr_events_inflight_snap(&s);
	return gdr_events_inflight_was(&s, overlaps, arg);
}

void gdr_events_inflight_snap(struct gdr_inflight_snap *s)
{
	s->all = false;
	s->n = 0;
	/* No free announced now (every slot was free at this load): what a scan that read every
	 * slot at once would find, without reading the table's lines on every miss. */
	if (!__atomic_load_n(&busy, __ATOMIC_SEQ_CST))
		return;
	if (__atomic_load_n(&overflow, __ATOMIC_SEQ_CST)) {
		s->all = true;
		return;
	}
	for (unsigned i = 0; i < GDR_INFLIGHT_SLOTS; i++) {
		uint32_t st = __atomic_load_n(&inflight[i].state, __ATOMIC_SEQ_CST);
		uint64_t start, len;

		if (st == IF_FREE)
			continue;
		if (st == IF_CLAIMED) {
			s->all = true;
			return;
		}
		start = __atomic_load_n(&inflight[i].start, __ATOMIC_SEQ_CST);
		len = __atomic_load_n(&inflight[i].len, __ATOMIC_SEQ_CST);
		/* Slot reused meanwhile: the range read may be torn; take it as everything. */
		if (__atomic_load_n(&inflight[i].state, __ATOMIC_SEQ_CST) != IF_PUBLISHED ||
		    len == GDR_EVENT_ALL_LEN) {
			s->all = true;
			return;
		}
		s->v[s->n].start = start;
		s->v[s->n].len = len;
		s->n++;
	}
}

bool gdr_events_inflight_was(const struct gdr_inflight_snap *s,
			     bool (*overlaps)(uint64_t start, uint64_t len, const void *arg),
			     const void *arg)
{
	if (s->all)
		return true;
	for (unsigned i = 0; i < s->n; i++)
		if (overlaps(s->v[i].start, s->v[i].len, arg))
			return true;
	return false;
}

unsigned gdr_events_inflight_count(void)
{
	unsigned n = __atomic_load_n(&overflow, __ATOMIC_SEQ_CST);

	for (unsigned i = 0; i < GDR_INFLIGHT_SLOTS; i++)
		n += __atomic_load_n(&inflight[i].state, __ATOMIC_SEQ_CST) != IF_FREE;
	return n;
}

/* fork(): the child has only the forking thread. A slot another thread had reserved but not yet
 * written would never be written (a drain would wait for it for ever), and a free another thread
 * had announced would never end (registrations would wait for ever): the child writes such slots
 * as "everything freed" (every cache drops all it holds, which is right: the child cannot use the
 * parent's CUDA context anyway) and clears the announcements. */
static void events_fork_child(void)
{
	uint64_t head = __atomic_load_n(&HEAD, __ATOMIC_RELAXED);

	for (uint64_t n = head > GDR_EVENTS_RING ? head - GDR_EVENTS_RING : 0; n < head; n++) {
		struct slot *s = &ev.ring[n & (GDR_EVENTS_RING - 1)];

		if (__atomic_load_n(&s->seq, __ATOMIC_RELAXED) != n + 1) {
			s->start = 0;
			s->len = GDR_EVENT_ALL_LEN;
			s->kind = GDR_EV_FREE;
			__atomic_store_n(&s->seq, n + 1, __ATOMIC_RELEASE);
		}
	}
	for (unsigned i = 0; i < GDR_INFLIGHT_SLOTS; i++)
		__atomic_store_n(&inflight[i].state, IF_FREE, __ATOMIC_RELAXED);
	__atomic_store_n(&overflow, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&busy, 0, __ATOMIC_RELAXED);
}

static void __attribute__((constructor)) events_init(void)
{
	pthread_atfork(NULL, NULL, events_fork_child);
}

/* ---- The handlers (events.h) ---------------------------------------------------------------------
 * A fixed table, filled once per handler and never emptied: the hooks read it without a lock. */
static const struct gdr_event_handler *handlers[GDR_EVENT_HANDLERS];
__thread int gdr_locks_held __attribute__((tls_model("initial-exec")));

void gdr_events_add_handler(const struct gdr_event_handler *h)
{
	for (unsigned i = 0; i < GDR_EVENT_HANDLERS; i++) {
		const struct gdr_event_handler *cur = NULL;

		if (__atomic_compare_exchange_n(&handlers[i], &cur, h, false, __ATOMIC_SEQ_CST,
						__ATOMIC_SEQ_CST) ||
		    cur == h)
			return;
	}
	__builtin_trap(); /* more handlers than the library has: a build error, not a run-time one */
}

#define FOREACH_HANDLER(h)                                                                         \
	for (unsigned i_ = 0; i_ < GDR_EVENT_HANDLERS; i_++)                                       \
		for (const struct gdr_event_handler *h =                                           \
			     __atomic_load_n(&handlers[i_], __ATOMIC_ACQUIRE);                     \
		     h; h = NULL)

uint64_t gdr_events_dispatch(const struct gdr_event *e, bool nested, bool *deferred)
{
	uint64_t n = 0;

	*deferred = false;
	FOREACH_HANDLER(h)
	{
		bool d = false;

		n += h->event(e, nested, &d);
		*deferred |= d;
	}
	return n;
}

uint64_t gdr_events_dispatch_end(void)
{
	uint64_t n = 0;

	FOREACH_HANDLER(h)
	n += h->end();
	return n;
}

uint64_t gdr_events_dispatch_relieve(void)
{
	uint64_t n = 0;

	FOREACH_HANDLER(h)
	if (h->relieve)
		n += h->relieve();
	return n;
}
