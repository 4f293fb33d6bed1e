/* SPDX-License-Identifier: MIT */
/* Backends: how a GPU range is pinned and registered with a NIC (backend.c chooses one). */
#ifndef GDR_BACKEND_H
#define GDR_BACKEND_H

#include <stdbool.h>
#include <stdint.h>
#include <infiniband/verbs.h>
#include "gdrcache.h"
#include "common/config.h"
#include "common/defs.h"

struct gdr_verbs_ops;

/* gdrcache.ko's system calls (kmod.c's through libc; tests/support/fake_kmod.c simulates them). */
struct gdr_kmod_sys {
	int (*open)(const char *path, int flags);
	int (*close)(int fd);
	int (*ioctl)(int fd, unsigned long req, void *arg);
	void *(*mmap)(size_t len, int fd);
	int (*munmap)(void *addr, size_t len);
};
extern const struct gdr_kmod_sys gdr_kmod_sys_libc;
/* What the library calls below it: the NIC and gdrcache.ko. Each cache has its own (the real ones,
 * or a test's: cache/seams.h) and gives it to the backends it opens. */
struct gdr_sys {
	const struct gdr_verbs_ops *verbs;
	const struct gdr_kmod_sys *kmod;
};

/* One pinned range, as a backend made it. */
struct gdr_be;
struct gdr_pin {            /* 40 bytes (an entry holds one) */
	uint64_t base, len; /* 64 KiB-aligned */
	struct gdr_be *be;  /* the backend that pinned it (its device's) */
	union {
		uint64_t kmod_handle; /* has_kmod */
		int dmabuf_fd;        /* has_dmabuf: a dma-buf of exactly [base, base+len) */
	};
	uint32_t page_count;
	int16_t device;     /* CUDA ordinal of the memory */
	uint8_t page_shift; /* gdrcache.ko's page size: 1 << page_shift (0: none) */
	uint8_t has_kmod : 1;
	uint8_t has_dmabuf : 1;
};
_Static_assert(GDR_MAX_DEVICES <= INT16_MAX, "a device ordinal fits a pin");

struct gdr_be;
struct gdr_backend_ops {
	const char *name;
	enum gdr_backend id;
	/* Open the backend over sys; 0, or -ENODEV with *why saying what is missing. */
	int (*open)(const struct gdr_config *cfg, const struct gdr_sys *sys, struct gdr_be **b,
		    const char **why);
	void (*close)(struct gdr_be *b);
	/* Pin pin->base/len. 0 or -errno (-ENOMEM / -ENOSPC: out of pinnable space, worth evicting). */
	int (*pin)(struct gdr_be *b, struct gdr_pin *pin);
	void (*unpin)(struct gdr_be *b, struct gdr_pin *pin);
	/* Register [base, base+len) of the pinned range with a NIC (the whole pin, or exactly what a
	 * remote-access registration asked). 0 or -errno. */
	int (*reg_mr)(struct gdr_be *b, const struct gdr_pin *pin, struct ibv_pd *pd, int access,
		      uint64_t base, uint64_t len, struct ibv_mr **mr);
	/* Physical page addresses (kmod); the count, or -errno (-ENOENT when the backend has none). */
	int (*pages)(struct gdr_be *b, const struct gdr_pin *pin, uint64_t *pages, uint32_t max);
	/* Whether the kernel has revoked the pin (its memory was freed): a load from memory the
	 * kernel shares, no system call; safe without the cache lock. Only where .revokes. */
	bool (*revoked)(struct gdr_be *b, const struct gdr_pin *pin);
	/* The kernel tells this backend of frees (revoked is called on every hit). */
	bool revokes;
	/* Whether the backend can pin memory of CUDA device `device` (NULL: every device). 1, or 0
	 * with *why. */
	int (*serves)(struct gdr_be *b, int device, const char **why);
	/* Whether this backend works without a PD (a pin exists before any MR). */
	bool pins_without_pd;
	/* Stream-ordered pool memory is pinned as the whole physical chunks of the pool that hold
	 * the range (the driver exports a dma-buf of pool memory only so: docs/FACTS.md, "Pool
	 * memory"); else as the 64 KiB-aligned range, like other memory. */
	bool pool_by_chunk;
};
/* Every backend embeds this first. */
struct gdr_be {
	const struct gdr_backend_ops *ops;
	struct gdr_sys sys; /* what it calls below it (given at open) */
};

extern const struct gdr_backend_ops gdr_backend_kmod_ops;
extern const struct gdr_backend_ops gdr_backend_dmabuf_ops;
extern const struct gdr_backend_ops gdr_backend_peermem_ops;
/* backend.c: choose and open (cfg->backend, AUTO resolved with the reason logged). */
int gdr_backend_select(const struct gdr_config *cfg, const struct gdr_sys *sys, struct gdr_be **b);
/* For mode AUTO: open the first backend after `primary` in the automatic order that serves CUDA
 * device `device` (a GPU without dma-buf support next to one with). 0, or -EOPNOTSUPP (logged). */
int gdr_backend_for_device(const struct gdr_config *cfg, const struct gdr_be *primary, int device,
			   struct gdr_be **b);
/* Shared default for backends without a page list. */
int gdr_backend_no_pages(struct gdr_be *b, const struct gdr_pin *pin, uint64_t *pages,
			 uint32_t max);
/* For backends with no state of their own: a bare struct gdr_be, and its release. */
int gdr_backend_alloc(const struct gdr_backend_ops *ops, const struct gdr_sys *sys,
		      struct gdr_be **out, const char **why);
void gdr_backend_free(struct gdr_be *b);

#endif /* GDR_BACKEND_H */
