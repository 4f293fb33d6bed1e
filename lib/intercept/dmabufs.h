/* SPDX-License-Identifier: MIT */
/*
 * The dma-bufs the CUDA driver exported in this process (dmabufs.c): which GPU range each one
 * holds, learnt when the driver exports it, so that a registration of its fd (ibv_reg_dmabuf_mr
 * through the preload) can be served from the cache by address.
 */
#ifndef GDRCACHE_DMABUFS_H
#define GDRCACHE_DMABUFS_H

#include <stdint.h>

#include "common/defs.h"

/* The export hook (hooks.c), after cuMemGetHandleForAddressRange(DMA_BUF_FD) of [va, va + size)
 * returned fd: recorded by the dma-buf's identity (its inode), if the allocation at va is the one
 * that was there before the call (BUFFER_ID id0, 0 where it could not be read). */
GDR_HIDDEN void gdr_dmabufs_exported(int fd, uint64_t va, uint64_t size, uint64_t id0);
/* A free of [start, start + len) (len 0: the allocation at start; GDR_EVENT_ALL_LEN: everything),
 * or an allocation of it (the address was free, whatever was recorded there is gone): forget
 * every dma-buf of memory it touches. */
GDR_HIDDEN void gdr_dmabufs_drop(uint64_t start, uint64_t len);
/* The GPU range [*va, *va + *size) the dma-buf behind fd was exported for, vouched for: recorded at
 * its export in this process, the same dma-buf (inode and size), the allocation at *va still the
 * one exported (BUFFER_ID), and the free events proven. 0, or -ENOSYS (no free events: nothing is
 * vouched for), -EBADF (fd is no open file), -ENOENT (no dma-buf this process's driver exported
 * since the library's interception began: another driver's, another process's, an earlier one's),
 * -ESTALE (the memory it was exported from is gone, or the record is too old: forgotten). */
GDR_HIDDEN int gdr_dmabufs_lookup(int fd, uint64_t *va, uint64_t *size);
/* How long after its export a record is trusted (dmabufs.c says why); a seam for the tests. */
extern GDR_HIDDEN uint64_t gdr_dmabufs_ttl_ns;
/* Counters: recorded, vouched for, refused as stale, forgotten on a free, evicted, held now. */
struct gdr_dmabufs_counts {
	uint64_t recorded, vouched, stale, dropped, evicted, live;
};
GDR_HIDDEN void gdr_dmabufs_counts(struct gdr_dmabufs_counts *c);

#endif /* GDRCACHE_DMABUFS_H */
