/* SPDX-License-Identifier: MIT */
/*
 * gdr_transport: a small RDMA transport library of the shape MPI and UCX give their GPU data path.
 * It registers buffers with libgdrcache (gdr_reg/gdr_dereg around every operation; the cache makes
 * that cheap and never hands out a stale registration), moves data with verbs RDMA WRITE over one RC
 * queue pair per peer, and uses MPI only to exchange queue-pair addresses and keys and to
 * synchronise. See docs/preload.md for how to launch it.
 */
#ifndef GDR_TRANSPORT_H
#define GDR_TRANSPORT_H
#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

struct gt_ctx;

/* What a peer needs to RDMA-write into a buffer, sent over MPI. */
struct gt_key {
	uint64_t addr;
	uint64_t len;
	uint32_t rkey;
	uint32_t pad;
};

struct gt_stats {
	uint64_t writes, bytes, regs;
	uint64_t stale;        /* registrations whose buffer id differed from the driver's (must be 0) */
	uint64_t hits, misses, cache_stale, events, validate_mode; /* from gdr_cache_get_stats */
	/* (all 0 with GT_NO_CACHE) */
};

/* gt_open's flags. GT_NO_CACHE: no libgdrcache; every operation registers its buffer with
 * ibv_reg_mr and deregisters it after, as naive code does (the comparison without the cache). */
#define GT_NO_CACHE 1u

/* Opens device `dev` (NULL: the first), GID index `gid_index`, and connects one RC QP to every
 * other rank of comm (collective). Unknown flags fail. Returns NULL on failure (message on
 * stderr). */
struct gt_ctx *gt_open(MPI_Comm comm, const char *dev, int gid_index, unsigned flags);
/* Registers [buf, buf+len) for remote writes and fills *key; gt_unexpose releases it. */
int gt_expose(struct gt_ctx *ctx, void *buf, size_t len, struct gt_key *key);
int gt_unexpose(struct gt_ctx *ctx);
/* RDMA-writes [src, src+len) into the peer's exposed buffer at key->addr + off, and waits for the
 * completion: the data is in the peer's memory when it returns 0. */
int gt_write(struct gt_ctx *ctx, int peer, const void *src, size_t len, const struct gt_key *key,
	     uint64_t off);
void gt_get_stats(struct gt_ctx *ctx, struct gt_stats *s);
void gt_close(struct gt_ctx *ctx);
#endif
