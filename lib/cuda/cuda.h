/* SPDX-License-Identifier: MIT */
/* The CUDA driver, loaded at run time (cuda.c): all the library asks of it. */
#ifndef GDR_CUDA_H
#define GDR_CUDA_H

#include <stdbool.h>
#include <stdint.h>
#include "cuda/cuda_abi.h"
#include "common/defs.h"

struct gdr_ptr_info {
	int mem_type; /* CUmemorytype, 0 when CUDA does not know the pointer */
	bool managed;
	int device; /* ordinal */
	uint64_t buffer_id;
	uint64_t start, size;             /* the allocation (or VMM mapping) holding the pointer */
	uint64_t alloc_start, alloc_size; /* RANGE_*: the whole allocation (a VMM reservation) */
	uint64_t map_start, map_size; /* MAPPING_*: the physical chunk holding it (0: unknown) */
	bool pool;                    /* stream-ordered pool memory (MEMPOOL_HANDLE set) */
};
/* What the loader tells the layer that watches the driver (the interception: lib/intercept/ gives
 * its own to gdr_cuda_load). The loader calls these and never names that layer. Every member may be
 * NULL. */
struct gdr_cuda_watch {
	/* Once, between libcuda's dlopen and cuInit (the driver has started no thread of its own).
	 * fresh: this load dlopened libcuda in a process with no other thread, so no thread can be
	 * inside it. */
	void (*loaded)(void *libcuda, bool fresh);
	/* Around the loader's borrows of a primary context (gdr_cuda_context_borrow): _begin before it
	 * looks at the context's state and retains it, returning a token; _looked after, with whether
	 * it retained. own_release(token) around the borrow's release of its reference, then
	 * own_release(0). */
	uint64_t (*borrow_begin)(void);
	void (*borrow_looked)(bool retained);
	void (*own_release)(uint64_t token);
	/* Around the loader's own dma-buf export: true before, false after. */
	void (*own_export)(bool begin);
};
/* Load libcuda (once per process) under watch w: the first call's w is the one kept (callers all
 * pass the interception's: intercept/hooks.h, gdr_driver_load). 0, or -ENODEV (no driver, no entry
 * point, cuInit failed). */
int gdr_cuda_load(const struct gdr_cuda_watch *w);
/* One cuPointerGetAttributes query. 0 (mem_type 0 = unknown to CUDA), -ENODEV, -EIO. */
int gdr_cuda_classify(uint64_t addr, struct gdr_ptr_info *info);
/* MAPPING_BASE_ADDR / MAPPING_SIZE of addr: the physical chunk holding it. 0, -EIO, -ENODEV. */
int gdr_cuda_mapping(uint64_t addr, uint64_t *base, uint64_t *size);
/* cuPointerGetAttribute(BUFFER_ID). 0, -ESTALE (CUDA no longer knows the address), -EIO. */
int gdr_cuda_buffer_id(uint64_t addr, uint64_t *id);
/* SYNC_MEMOPS on the allocation. 0, -EOPNOTSUPP (NOT_SUPPORTED: VMM memory), -EIO. */
int gdr_cuda_set_sync_memops(uint64_t addr);
/* CU_CTX_SYNC_MEMOPS on the current context (the device's primary context on a thread with none),
 * once per context. 1 (set now), 0 (set before), -EOPNOTSUPP (driver without cuCtxSetFlags),
 * -ENXIO (no context to be had), -EIO. */
int gdr_cuda_ctx_sync_memops(int device);
/* cuMemGetHandleForAddressRange(DMA_BUF_FD), in the device's primary context when the calling
 * thread has none. 0 and *fd, or -errno. */
int gdr_cuda_dmabuf_export(uint64_t base, uint64_t len, int device, int *fd);
/* cuDeviceGetAttribute. 0 or -errno. */
int gdr_cuda_device_attr(int device, int attr, int *value);
/* CUDA devices (cuDeviceGetCount); 0 without a driver. */
int gdr_cuda_device_count(void);
/* devices.c: what the GPUs offer to pins, found once per process (the first call). */
struct gdr_cuda_devices {
	uint64_t bar1, mem; /* summed over the devices that told (0: none did) */
	/* What each device can have pinned, the smaller of its BAR1 and memory (the one it told where
	 * it told one): summed, and the least of them. */
	uint64_t pinnable, pinnable_min;
	int ndev;
	char why[160];      /* what they were derived from, for the info line */
	char bar1_miss[96]; /* the first sysfs file that gave no BAR1 size */
};
const struct gdr_cuda_devices *gdr_cuda_devices(void);
/* Device dev's PCI address, "dddd:bb:ss.0", into pci (devices.c). 0 or -ENODEV (the driver does
 * not tell it). */
GDR_HIDDEN int gdr_cuda_device_pci(int dev, char *pci, size_t n);
/* The size of BAR1 of the PCI function pci from sysfs: the largest BAR after BAR0; 0 if unknown.
 * path: the sysfs file read (for a message). */
GDR_HIDDEN uint64_t gdr_cuda_pci_bar1(const char *pci, char *path, size_t n);
/* One device's BAR1 and memory (0: unknown) added to f (devices.c; apart for the tests). */
GDR_HIDDEN void gdr_cuda_devices_add(struct gdr_cuda_devices *f, uint64_t bar1, uint64_t mem);
/* libcuda's dlopen handle once gdr_cuda_load succeeded, else NULL. */
GDR_HIDDEN void *gdr_cuda_libcuda_handle(void);
/* Make the device's primary context current on a thread that has none or another device's (an
 * opaque token for gdr_cuda_context_return; NULL with *err -ENXIO or -ENOMEM when it could not) /
 * undo it. */
GDR_HIDDEN void *gdr_cuda_context_borrow(int device, int *err);
GDR_HIDDEN void gdr_cuda_context_return(void *borrowed);
/* After a context was destroyed: forget which contexts have CU_CTX_SYNC_MEMOPS. */
GDR_HIDDEN void gdr_cuda_contexts_changed(void);

#endif /* GDR_CUDA_H */
