/* SPDX-License-Identifier: MIT */
/*
 * The shadow records' hit path, inline in interpose.c's ibv_reg_mr / ibv_dereg_mr: taking a free
 * record of the thread, publishing it, telling one of ours from libibverbs' MR and taking it back.
 * What the records are, and why this is safe without a lock: mrtab.c.
 */
#ifndef GDR_PRELOAD_MRTAB_H
#define GDR_PRELOAD_MRTAB_H

#include <errno.h>
#include <stddef.h>

#include "preload.h"

#define GDRP_TLS __thread __attribute__((tls_model("initial-exec")))

enum gdrp_rec_state {
	GDRP_REC_FREE = 0, /* a fresh slot's zero too */
	GDRP_REC_LIVE = 0x6764724c,
	GDRP_REC_TAKEN = 0x67647254,
	GDRP_REC_HELD = 0x67647248,
};

struct gdrp_slot {
	struct gdrp_rec rec;    /* first: the MR the program holds is the slot's address */
	uint32_t state;         /* enum gdrp_rec_state; atomic */
	struct gdrp_slot *next; /* while free: the next in its list */
};

/* A power of two (the boundary check is a mask), two cache lines: a record shares no line. */
#define GDRP_SLOT_SIZE 128
_Static_assert(sizeof(struct gdrp_slot) <= GDRP_SLOT_SIZE, "a shadow record outgrew its slot");
#define GDRP_REC_KEEP 64 /* free records a thread keeps at most */

extern char *gdrp_arena;      /* atomic; set once, never unmapped */
extern size_t gdrp_committed; /* atomic; bytes of it mapped, only grows, stored after gdrp_arena */
/* The thread's free records, oldest first, and their number. */
extern GDRP_TLS struct gdrp_slot *gdrp_kept, *gdrp_kept_last;
extern GDRP_TLS unsigned gdrp_nkept;
extern GDRP_TLS bool gdrp_kept_armed; /* the thread's exit hands its list to the pool */

struct gdrp_slot *gdrp_rec_refill(void);      /* the list was empty: the thread's next, or NULL */
void gdrp_rec_free_slow(struct gdrp_slot *s); /* not armed yet, or the list is full */
int gdrp_rec_take_held(struct gdrp_slot *s);  /* gdrp_rec_take met HELD: wait, then take */

/* A free record, not yet published, its fields left as they were: the caller fills every one.
 * NULL: none to be had (out of memory, or the arena is full). */
static inline struct gdrp_rec *gdrp_rec_new(void)
{
	struct gdrp_slot *s = gdrp_kept;

	if (__builtin_expect(!s, 0)) {
		s = gdrp_rec_refill();
		if (!s)
			return NULL;
	}
	gdrp_kept = s->next;
	if (!gdrp_kept)
		gdrp_kept_last = NULL;
	gdrp_nkept--;
	return &s->rec;
}

/* Filled: ibv_dereg_mr / ibv_rereg_mr may take it from here on (store-release). */
static inline void gdrp_rec_publish(struct gdrp_rec *r)
{
	__atomic_store_n(&((struct gdrp_slot *)(void *)r)->state, GDRP_REC_LIVE, __ATOMIC_RELEASE);
}

/* s to the end of this thread's list of free records (reused oldest first). */
static inline void gdrp_kept_append(struct gdrp_slot *s)
{
	s->next = NULL;
	if (gdrp_kept_last)
		gdrp_kept_last->next = s;
	else
		gdrp_kept = s;
	gdrp_kept_last = s;
	gdrp_nkept++;
}

/* A record never published, or taken: back to the thread's list (its end). */
static inline void gdrp_rec_free(struct gdrp_rec *r)
{
	struct gdrp_slot *s = (struct gdrp_slot *)(void *)r;

	/* Only a failing compare-and-swap reads it from here on: nothing else of it is read. */
	__atomic_store_n(&s->state, GDRP_REC_FREE, __ATOMIC_RELAXED);
	if (__builtin_expect(!gdrp_kept_armed || gdrp_nkept >= GDRP_REC_KEEP, 0)) {
		gdrp_rec_free_slow(s);
		return;
	}
	gdrp_kept_append(s);
}

/* 0: *r is mr's record, taken (unpublished) by this caller; -ENOENT: mr is not one of ours (a real
 * MR: libibverbs'); -EINVAL: ours but not published (released already, or being released or
 * re-registered by another thread). */
static inline int gdrp_rec_take(struct ibv_mr *mr, struct gdrp_rec **r)
{
	/* gdrp_committed first: once it is nonzero, gdrp_arena is set (stored before, release). */
	size_t lim = __atomic_load_n(&gdrp_committed, __ATOMIC_ACQUIRE);
	uintptr_t off = (uintptr_t)mr - (uintptr_t)__atomic_load_n(&gdrp_arena, __ATOMIC_RELAXED);
	struct gdrp_slot *s = (struct gdrp_slot *)(void *)mr;
	uint32_t st = GDRP_REC_LIVE;

	if (off >= lim || off % GDRP_SLOT_SIZE)
		return -ENOENT;
	if (!__atomic_compare_exchange_n(&s->state, &st, GDRP_REC_TAKEN, false, __ATOMIC_ACQUIRE,
					 __ATOMIC_RELAXED)) {
		if (st != GDRP_REC_HELD || gdrp_rec_take_held(s))
			return -EINVAL;
	}
	*r = &s->rec;
	return 0;
}

#endif /* GDR_PRELOAD_MRTAB_H */
