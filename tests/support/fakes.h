/* SPDX-License-Identifier: MIT */
/*
 * Test doubles for what the unit tests' machine lacks (SIMULATIONS): a pinning backend with fault
 * injection and a page-level record of what is pinned, libibverbs' MR calls, and gdrcache.ko's
 * system calls. The CUDA driver's double is tests/fake (libcuda.so.1).
 */
#ifndef GDR_TEST_FAKES_H
#define GDR_TEST_FAKES_H

#include <stdbool.h>
#include <stdint.h>

#include <infiniband/verbs.h>

#include "gdrcache/uapi.h"
#include "backend/backend.h"
#include "cache/seams.h"
#include "common/defs.h"
#include "nic/verbs.h"

/* ---- fake backend ---- */
extern const struct gdr_backend_ops fake_backend_ops;
struct fake_backend_state {
	uint64_t pins, unpins, outstanding, outstanding_bytes, max_outstanding_bytes;
	uint64_t double_pinned_now;    /* pages pinned by more than one live pin now */
	uint64_t bad_pins;             /* pins of a range CUDA does not back (the real driver refuses) */
	uint64_t enomem_after;         /* pin fails -ENOMEM while this many pins are outstanding (0 off) */
	uint64_t bar_bytes;            /* pin fails -ENOSPC past this many outstanding bytes (0 off) */
	int fail_next_rc;              /* the next fail_next_n pins fail with this */
	unsigned fail_next_n;
	bool require_pd;               /* behave like peermem: no pin without an MR */
};
extern struct fake_backend_state fake_be;
void fake_backend_reset(void);
/* Whether [a, a+len) lies in the live pin behind r that still maps the memory now at those addresses
 * (the fake's record of physical generations, from fake_cuda_phys_gen). */
bool fake_backend_pin_current(const struct gdr_region *r, uint64_t a, uint64_t len);

/* ---- the seams of the caches a test makes (cache/seams.h) ---- */
/* What fake_cache_create gives a cache: the fakes installed below, and the events probe a test sets
 * (NULL: the real one). */
extern struct gdr_cache_seams fake_seams;
/* gdr_cache_create over fake_seams, with backend ops (NULL: the configured backend). */
int fake_cache_create(const struct gdr_cache_attr *attr, const struct gdr_backend_ops *ops,
		      struct gdr_cache **cache);

/* ---- fake verbs (installed by fake_verbs_install into fake_seams) ---- */
struct fake_verbs_state {
	uint64_t regs, dmabuf_regs, deregs, outstanding;
	int fail_next_errno;
	unsigned fail_next_n;
};
extern struct fake_verbs_state fake_verbs;
void fake_verbs_install(void);
/* A unit test's fresh start: the fake driver and backend reset, the fake libibverbs installed with
 * its counts zeroed (fake_verbs.c). */
void fakes_reset(void);
#define FAKE_PD ((struct ibv_pd *)(uintptr_t)0x1000)
#define FAKE_PD2 ((struct ibv_pd *)(uintptr_t)0x2000)

/* ---- fake gdrcache.ko system calls (installed by fake_kmod_install) ---- */
struct fake_kmod_state {
	bool present;                  /* the device node exists */
	uint32_t major;                /* what GET_VERSION reports */
	uint64_t outstanding;
	uint64_t ioctls_bad;           /* ioctls with non-zero reserved fields or unknown flags */
	int pin_fail_rc;
	unsigned pin_fail_n;
	bool closed;
};
extern struct fake_kmod_state fake_kmod;
void fake_kmod_install(void);
/* Mark the pins holding va revoked in the shared area, as the free callback does. Returns how many. */
int fake_kmod_revoke(uint64_t va);

#endif
