/* SPDX-License-Identifier: MIT */
/*
 * A fake CUDA driver, libcuda.so.1, for libgdrcache's unit tests: a SIMULATION of NVIDIA's
 * libcuda, with the real entry points' names and C prototypes, behaving as the real driver was
 * measured to behave (FACTS.md, and the probes listed here), plus a control API (fake_cuda.h).
 *
 * This file: the memory model (VA arena, chunks, allocations), pointer attributes, dma-buf export,
 * call counting and faults, cuGetProcAddress. fake_cuda_ctx.c, fake_cuda_pool.c and fake_cuda_ipc.c
 * hold the rest (fake_cuda_internal.h is what they share).
 *
 * Measured on an H100, driver 580.159.04, CUDA 13.0 (probes run for this file), and simulated:
 *  - cuGetProcAddress_v2: an unknown name returns CUDA_SUCCESS with *pfn = NULL and status
 *    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND (1), not CUDA_ERROR_NOT_FOUND; a name asked for with a
 *    cudaVersion below the one that introduced it (cuCtxSetFlags: 12010, so 12000 is too low)
 *    returns CUDA_SUCCESS, *pfn = NULL, status VERSION_NOT_SUFFICIENT (2). The v1 cuGetProcAddress
 *    returns CUDA_ERROR_NOT_FOUND in both cases and leaves *pfn alone. Names ending in _v2 are not
 *    found. flags > 2: CUDA_ERROR_INVALID_VALUE.
 *  - Before cuInit, pointer queries return CUDA_ERROR_NOT_INITIALIZED.
 *  - cuMemAlloc: sizes are rounded to 512 bytes and sub-allocated first-fit (1 and 100 bytes: 512
 *    apart, 513: 1024, 4096: 4096, 5000: 5120, 64 KiB: 64 KiB apart and not 64 KiB aligned); 1 MiB
 *    was still sub-allocated, 2 MiB - 4 KiB and more got their own 2 MiB-aligned chunks. Freeing
 *    a small buffer and allocating any size that fits gives its VA back (first fit); a 4 MiB
 *    free + alloc gave the same VA 20 of 20 times. RANGE_SIZE and cuMemGetAddressRange give the
 *    requested size. cuMemAlloc(0): CUDA_ERROR_INVALID_VALUE. (Not simulated: the driver also
 *    places small buffers in the unused tail of a large buffer's last chunk.)
 *  - cuPointerGetAttributes on memory CUDA does not know (malloc, NULL, a freed buffer, an unmapped
 *    VMM address): CUDA_SUCCESS; CONTEXT NULL, MEMORY_TYPE 0, BUFFER_ID 0, IS_MANAGED 0,
 *    DEVICE_ORDINAL -2, MAPPED 0, HOST_POINTER = ptr, DEVICE_POINTER 0, the rest 0, and
 *    RANGE_START_ADDR / RANGE_SIZE left untouched (inside a VMM reservation: the reservation).
 *    cuPointerGetAttribute of any attribute there: CUDA_ERROR_INVALID_VALUE; SYNC_MEMOPS set:
 *    CUDA_ERROR_INVALID_VALUE; cuMemGetAddressRange: CUDA_ERROR_NOT_FOUND.
 *  - Bool attributes are written as 4 bytes. numAttributes 0 or an unknown attribute:
 *    CUDA_ERROR_INVALID_VALUE.
 *  - Managed memory: MEMORY_TYPE DEVICE (2), IS_MANAGED 1, HOST_POINTER = DEVICE_POINTER = ptr,
 *    IS_GPU_DIRECT_RDMA_CAPABLE 0, SYNC_MEMOPS succeeds, dma-buf export fails (INVALID_VALUE).
 *  - cuMemAllocHost: MEMORY_TYPE HOST (1), a BUFFER_ID, CONTEXT the context, RANGE_SIZE the request,
 *    SYNC_MEMOPS succeeds, dma-buf export fails; its VAs come from the same space as device memory.
 *  - VMM: CONTEXT NULL, RANGE_START_ADDR / RANGE_SIZE = the whole *reservation* (not the mapping),
 *    MAPPING_BASE_ADDR / MAPPING_SIZE and cuMemGetAddressRange = the mapping, SYNC_MEMOPS set:
 *    CUDA_ERROR_NOT_SUPPORTED; unmap + map gives a new BUFFER_ID; a partial cuMemUnmap and a
 *    cuMemAddressFree with a live mapping: CUDA_ERROR_INVALID_VALUE.
 *  - Pool (cuMemAllocAsync): CONTEXT NULL, IS_GPU_DIRECT_RDMA_CAPABLE 0, MEMPOOL_HANDLE set,
 *    SYNC_MEMOPS succeeds. Its 32 MiB chunks, their MAPPING attributes and their export rule
 *    (measured on H200s for issue 11): fake_cuda_pool.c.
 *  - Device memory: MAPPING_BASE_ADDR / MAPPING_SIZE = the 2 MiB chunk, MEMORY_BLOCK_ID = the chunk.
 *  - cuMemGetHandleForAddressRange(DMA_BUF_FD): dptr and size multiples of 4096, size > 0, else
 *    INVALID_VALUE; flags != 0: NOT_SUPPORTED; no current context: INVALID_CONTEXT. Export is by
 *    VA range: a range that overlaps no live allocation fails (a freed small buffer's page, free
 *    space after the last buffer of a chunk, the unused tail of a 3 MiB buffer's 4 MiB chunk),
 *    while one that overlaps a live allocation succeeds even when it starts or ends in free space
 *    of live chunks (a 64 KiB range starting in a freed buffer and covering a live one, the whole
 *    2 MiB chunk holding three 4 KiB buffers, a 3 MiB buffer's last 1 MiB plus its chunk's tail)
 *    or spans chunks (4 MiB over two 2 MiB buffers); one running into an unmapped VMM range
 *    fails. Simulated rule: every byte inside live DEVICE, POOL or VMM chunks, and at least one
 *    live DEVICE, POOL or VMM allocation overlapping the range; pool chunks only whole (H200,
 *    fake_cuda_pool.c); the memory's device must have DMA_BUF_SUPPORTED.
 *  - Threads: a new thread has no current context; pointer queries and SYNC_MEMOPS still work;
 *    cuCtxGetFlags, cuMemAlloc, cuMemGetHandleForAddressRange, cuMemGetAddressRange and
 *    DEVICE_POINTER return CUDA_ERROR_INVALID_CONTEXT.
 *  - Context flags read back as the set flags | CU_CTX_MAP_HOST (0x8).
 *  - How the CUDA runtime reaches the driver (FACTS.md): dlsym(handle, "cuGetProcAddress_v2") once,
 *    then everything through it, by base name with a cudaVersion and flags: "cuGetProcAddress" at
 *    11030 (the v1 function) and 12000 (the v2 function), "cuMemFree" at 3020 (cuMemFree_v2),
 *    "cuMemFreeAsync" with flags 0 and 2 (PER_THREAD_DEFAULT_STREAM: the _ptsz function),
 *    "cuDevicePrimaryCtxRelease"/"Reset" at 7000 (the v1 functions; _v2 from 11000), "cuCtxDestroy"
 *    (_v2 from 4000). Simulated: that table; a flags-2 lookup of a function with a _ptsz variant
 *    returns it. cuMemUnmap is fake_cuda_vmm_unmap.
 *  - Devices and contexts (what a context destroy, reset or release frees, several GPUs, measured
 *    on two H200s): fake_cuda_ctx.c. Memory imported from another process (legacy IPC, VMM
 *    shareable handles) and the VMM entry points: fake_cuda_ipc.c.
 *  - Device attributes: 0 and >= 148 (CU_DEVICE_ATTRIBUTE_MAX): INVALID_VALUE; a device >= the
 *    count: INVALID_DEVICE. cuGetErrorName of an unknown code: INVALID_VALUE, *str = NULL.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda_internal.h"
#include "nvp2p_sim_uapi.h"

int fake_api_flag;

/* ---- Entry points: names, counters, faults -------------------------------------------------- */
static const char *const entry_name[E_COUNT] = {
#define X(n) [E_##n] = #n,
	FAKE_ENTRIES(X)
#undef X
};

struct fault {
	unsigned skip;
	unsigned n;
	CUresult result;
};

static _Atomic uint64_t g_calls[E_COUNT];
static atomic_uint g_faults_armed;  /* entries with n > 0 */
static atomic_bool g_initialized;

/* ---- Memory model --------------------------------------------------------------------------- */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint64_t g_arena_base, g_arena_end, g_arena_bump;
static struct span *g_free_va; /* freed chunk VA ranges, LIFO */
static size_t g_nfree_va, g_cap_free_va;
struct vec g_allocs, g_chunks, g_resvs;
static uint64_t g_next_id = 1000; /* BUFFER_IDs: never reset */
static uint64_t g_last_id;
static uint64_t g_next_block = 1;
bool g_force_new_va;
int g_pool_handle[FAKE_CUDA_MAX_DEVICES];
static int g_driver_version = FAKE_CUDA_DRIVER_VERSION;
static CUresult g_init_error;
static struct fault g_faults[E_COUNT];
static char g_hidden[32][64];
static unsigned g_nhidden;
static int g_min_version_override[E_COUNT]; /* 0: default */
static uint64_t g_dmabuf_exports;
static fake_cuda_free_observer_t g_observer;
static void *g_observer_arg;
static int g_sim_fd = -1;
static bool g_sim_broken; /* FAKE_CUDA_P2P_SIM set but the device could not be opened */

static void state_init(void)
{
	/* PROT_NONE and MAP_NORESERVE: VA only, pages appear when a chunk is made read-write.
	 * Aligned to the pool chunk size, so that pool chunks start at 32 MiB boundaries. */
	void *p = mmap(NULL, ARENA_SIZE + POOL_CHUNK, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p != MAP_FAILED) {
		g_arena_base = ((uint64_t)(uintptr_t)p + POOL_CHUNK - 1) & ~(POOL_CHUNK - 1);
		g_arena_end = g_arena_base + ARENA_SIZE;
		g_arena_bump = g_arena_base;
	}
	default_devattrs();

	const char *sim = getenv("FAKE_CUDA_P2P_SIM");

	if (sim && *sim) {
		g_sim_fd = open(sim, O_RDWR | O_CLOEXEC);
		if (g_sim_fd < 0) {
			fprintf(stderr, "fake_cuda: FAKE_CUDA_P2P_SIM=%s: %s; allocations will fail\n",
				sim, strerror(errno));
			g_sim_broken = true;
		}
	}
}

/* Take the lock, after making sure the state exists. */
void lock(void)
{
	pthread_once(&g_once, state_init);
	pthread_mutex_lock(&g_lock);
}

void unlock(void)
{
	pthread_mutex_unlock(&g_lock);
}

/* Count the call, apply an armed fault, check cuInit. Returns true with *rc when the call must
 * return *rc at once. */
static void (*_Atomic g_enter_hook)(const char *entry, void *arg);
static void *_Atomic g_enter_hook_arg;

bool enter(enum entry e, bool need_init, CUresult *rc)
{
	void (*hook)(const char *, void *) = atomic_load(&g_enter_hook);

	if (hook)
		hook(entry_name[e], atomic_load(&g_enter_hook_arg));
	atomic_fetch_add_explicit(&g_calls[e], 1, memory_order_relaxed);
	if (atomic_load_explicit(&g_faults_armed, memory_order_acquire)) {
		bool fail = false;

		lock();
		struct fault *f = &g_faults[e];

		if (f->n) {
			if (f->skip) {
				f->skip--;
			} else {
				fail = true;
				*rc = f->result;
				if (--f->n == 0)
					atomic_fetch_sub(&g_faults_armed, 1);
			}
		}
		unlock();
		if (fail)
			return true;
	}
	if (need_init && !atomic_load(&g_initialized)) {
		*rc = CUDA_ERROR_NOT_INITIALIZED;
		return true;
	}
	return false;
}

/* ---- Sorted vectors of spans ---------------------------------------------------------------- */

/* Index of the first element whose va > key. */
size_t vec_upper(const struct vec *v, uint64_t key)
{
	size_t lo = 0, hi = v->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (v->v[mid]->va <= key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

void *vec_find(const struct vec *v, uint64_t addr)
{
	size_t i = vec_upper(v, addr);

	if (i == 0)
		return NULL;
	struct span *s = v->v[i - 1];

	return addr - s->va < s->size ? s : NULL;
}

int vec_insert(struct vec *v, void *obj)
{
	struct span *s = obj;

	if (v->n == v->cap) {
		size_t cap = v->cap ? v->cap * 2 : 64;
		struct span **nv = realloc(v->v, cap * sizeof(*nv));

		if (!nv)
			return -ENOMEM;
		v->v = nv;
		v->cap = cap;
	}
	size_t i = vec_upper(v, s->va);

	memmove(&v->v[i + 1], &v->v[i], (v->n - i) * sizeof(*v->v));
	v->v[i] = s;
	v->n++;
	return 0;
}

void vec_remove(struct vec *v, void *obj)
{
	struct span *s = obj;
	size_t i = vec_upper(v, s->va);

	while (i > 0 && v->v[i - 1] != s)
		i--;
	if (i == 0)
		return;
	memmove(&v->v[i - 1], &v->v[i], (v->n - i) * sizeof(*v->v));
	v->n--;
}

/* ---- VA space ------------------------------------------------------------------------------- */

uint64_t va_get(uint64_t size)
{
	if (!g_arena_base)
		return 0;
	if (!g_force_new_va) {
		for (size_t i = g_nfree_va; i-- > 0;) {
			if (g_free_va[i].size == size) {
				uint64_t va = g_free_va[i].va;

				memmove(&g_free_va[i], &g_free_va[i + 1],
					(g_nfree_va - i - 1) * sizeof(*g_free_va));
				g_nfree_va--;
				return va;
			}
		}
	}
	if (g_arena_end - g_arena_bump >= size) {
		uint64_t va = g_arena_bump;

		g_arena_bump += size;
		return va;
	}
	/* Out of fresh VA: first fit in the free list, splitting. */
	for (size_t i = 0; i < g_nfree_va; i++) {
		if (g_free_va[i].size >= size) {
			uint64_t va = g_free_va[i].va;

			g_free_va[i].va += size;
			g_free_va[i].size -= size;
			return va;
		}
	}
	return 0;
}

void va_put(uint64_t va, uint64_t size)
{
	if (g_nfree_va == g_cap_free_va) {
		size_t cap = g_cap_free_va ? g_cap_free_va * 2 : 64;
		struct span *n = realloc(g_free_va, cap * sizeof(*n));

		if (!n)
			return; /* leak the VA: harmless in a 64 GiB arena */
		g_free_va = n;
		g_cap_free_va = cap;
	}
	g_free_va[g_nfree_va++] = (struct span){ va, size };
}

/* ---- Chunks --------------------------------------------------------------------------------- */

bool kind_is_gpu(int kind)
{
	return kind == FAKE_CUDA_KIND_DEVICE || kind == FAKE_CUDA_KIND_POOL ||
	       kind == FAKE_CUDA_KIND_VMM;
}

static int sim_alloc(struct chunk *c)
{
	if (!kind_is_gpu(c->kind))
		return 0;
	if (g_sim_broken)
		return -ENODEV;
	if (g_sim_fd < 0)
		return 0;

	struct nvp2p_sim_alloc a = { .va = c->sp.va, .len = c->sp.size };

	if (ioctl(g_sim_fd, NVP2P_SIM_IOCTL_ALLOC, &a) < 0) {
		int err = errno;

		fprintf(stderr, "fake_cuda: NVP2P_SIM_IOCTL_ALLOC 0x%" PRIx64 "+0x%" PRIx64 ": %s\n",
			c->sp.va, c->sp.size, strerror(err));
		return -err;
	}
	c->sim_id = a.id;
	return 0;
}

static void sim_free(struct chunk *c)
{
	if (g_sim_fd < 0 || !c->sim_id)
		return;

	struct nvp2p_sim_free f = { .id = c->sim_id };

	if (ioctl(g_sim_fd, NVP2P_SIM_IOCTL_FREE, &f) < 0)
		fprintf(stderr, "fake_cuda: NVP2P_SIM_IOCTL_FREE %" PRIu64 ": %s\n", c->sim_id,
			strerror(errno));
	c->sim_id = 0;
}

/* Back [va, va+size) with memory and track it as a chunk of dev, owned by ctx (NULL for POOL and
 * VMM). VMM chunks live in a reservation. */
struct chunk *chunk_create(int kind, uint64_t va, uint64_t size, bool shared, struct resv *resv,
			   int dev, CUcontext ctx)
{
	struct chunk *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->sp = (struct span){ va, size };
	c->kind = kind;
	c->dev = dev;
	c->ctx = ctx;
	c->shared = shared;
	c->resv = resv;
	c->free_units = shared ? UNITS_PER_CHUNK : 0;
	if (mprotect((void *)(uintptr_t)va, size, PROT_READ | PROT_WRITE))
		goto err_free;
	if (sim_alloc(c))
		goto err_protect;
	if (vec_insert(&g_chunks, c))
		goto err_sim;
	c->block_id = g_next_block++;
	return c;

err_sim:
	sim_free(c);
err_protect:
	mprotect((void *)(uintptr_t)va, size, PROT_NONE);
err_free:
	free(c);
	return NULL;
}

/* Give a chunk's memory back: provider first (fires its free callbacks), then the pages. Its VA
 * goes to the free list, except in a reservation or a pool region (they own their VA). */
void chunk_release(struct chunk *c)
{
	void *p = (void *)(uintptr_t)c->sp.va;

	sim_free(c);
	madvise(p, c->sp.size, MADV_DONTNEED);
	mprotect(p, c->sp.size, PROT_NONE);
	vec_remove(&g_chunks, c);
	if (!c->resv && !c->pooled)
		va_put(c->sp.va, c->va_size ? c->va_size : c->sp.size);
	free(c);
}

static bool bm_test(const struct chunk *c, unsigned i)
{
	return c->bitmap[i / 64] >> (i % 64) & 1;
}

static void bm_set(struct chunk *c, unsigned first, unsigned n, bool on)
{
	for (unsigned i = first; i < first + n; i++) {
		if (on)
			c->bitmap[i / 64] |= 1ull << (i % 64);
		else
			c->bitmap[i / 64] &= ~(1ull << (i % 64));
	}
}

/* First run of n free units at or after `from`, or -1. */
static long bm_find(const struct chunk *c, unsigned n, unsigned from)
{
	unsigned run = 0;

	for (unsigned i = from; i < UNITS_PER_CHUNK; i++) {
		if (bm_test(c, i))
			run = 0;
		else if (++run == n)
			return (long)(i + 1 - n);
	}
	return -1;
}

/* ---- Allocations ---------------------------------------------------------------------------- */

struct alloc *alloc_new(int kind, uint64_t va, uint64_t size, struct chunk *c, unsigned first,
			unsigned n)
{
	struct alloc *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	a->sp = (struct span){ va, size };
	a->kind = kind;
	a->dev = c->dev;
	a->ctx = c->ctx;
	a->chunk = c;
	a->first_unit = first;
	a->nunits = n;
	if (vec_insert(&g_allocs, a)) {
		free(a);
		return NULL;
	}
	a->id = g_last_id = g_next_id++;
	c->live++;
	return a;
}

uint64_t do_alloc(int kind, uint64_t size, int dev, CUcontext ctx)
{
	if (size == 0 || size > ARENA_SIZE || dev < 0 || dev >= g_ndevices)
		return 0;
	if (kind == FAKE_CUDA_KIND_POOL)
		return pool_alloc(dev, size);
	ctx_used(ctx, dev);
	if (size <= FAKE_CUDA_SUBALLOC_MAX) {
		unsigned n = (unsigned)((size + UNIT - 1) / UNIT);

		for (size_t i = 0; i < g_chunks.n; i++) {
			struct chunk *c = (struct chunk *)g_chunks.v[i];

			if (c->kind != kind || c->dev != dev || c->ctx != ctx || !c->shared ||
			    c->free_units < n)
				continue;
			long at = bm_find(c, n, g_force_new_va ? c->hiwater : 0);

			if (at < 0)
				continue;
			struct alloc *a = alloc_new(kind, c->sp.va + (uint64_t)at * UNIT, size, c,
						    (unsigned)at, n);

			if (!a)
				return 0;
			bm_set(c, (unsigned)at, n, true);
			c->free_units -= n;
			if ((unsigned)at + n > c->hiwater)
				c->hiwater = (unsigned)at + n;
			return a->sp.va;
		}
		uint64_t va = va_get(CHUNK);

		if (!va)
			return 0;
		struct chunk *c = chunk_create(kind, va, CHUNK, true, NULL, dev, ctx);

		if (!c) {
			va_put(va, CHUNK);
			return 0;
		}
		struct alloc *a = alloc_new(kind, va, size, c, 0, n);

		if (!a) {
			chunk_release(c);
			return 0;
		}
		bm_set(c, 0, n, true);
		c->free_units -= n;
		c->hiwater = n;
		return va;
	}

	uint64_t csize = (size + CHUNK - 1) & ~(CHUNK - 1);
	uint64_t va = va_get(csize);

	if (!va)
		return 0;
	struct chunk *c = chunk_create(kind, va, csize, false, NULL, dev, ctx);

	if (!c) {
		va_put(va, csize);
		return 0;
	}
	if (!alloc_new(kind, va, size, c, 0, 0)) {
		chunk_release(c);
		return 0;
	}
	return va;
}

/* Drop one allocation; the lock is held. Records it in *fr for the observer. */
void do_free(struct alloc *a, struct freed *fr)
{
	struct chunk *c = a->chunk;

	if (fr)
		*fr = (struct freed){ a->sp.va, a->sp.size, a->id, a->kind };
	vec_remove(&g_allocs, a);
	if (a->kind == FAKE_CUDA_KIND_POOL) {
		pool_free(a);
		free(a);
		return;
	}
	if (a->kind == FAKE_CUDA_KIND_IPC)
		ipc_forget(a);
	if (c->shared) {
		bm_set(c, a->first_unit, a->nunits, false);
		c->free_units += a->nunits;
	}
	free(a);
	if (--c->live == 0) {
		if (c->resv)
			c->resv->nmaps--;
		chunk_release(c);
	}
}

void notify(const struct freed *fr)
{
	fake_cuda_free_observer_t cb;
	void *arg;

	lock();
	cb = g_observer;
	arg = g_observer_arg;
	unlock();
	if (cb)
		cb(fr->va, fr->size, fr->id, fr->kind, arg);
}

struct alloc *find_alloc(uint64_t addr)
{
	return vec_find(&g_allocs, addr);
}

/* Free the allocation starting at va if its kind is allowed. 0 or -EINVAL. */
int free_kind(uint64_t va, unsigned kinds_mask)
{
	struct freed fr;
	struct alloc *a;

	lock();
	a = find_alloc(va);
	if (!a || a->sp.va != va || !(kinds_mask & (1u << a->kind))) {
		unlock();
		return -EINVAL;
	}
	do_free(a, &fr);
	unlock();
	notify(&fr);
	return 0;
}


/* A control function's allocation: in ctx (NULL: the current context, else device 0's primary),
 * on its device; POOL: on dev (-1: the current context's device, else 0). */
static uint64_t alloc_kind(int kind, size_t size, int dev, CUcontext ctx)
{
	uint64_t va;

	if (!ctx)
		ctx = control_ctx();
	if (dev < 0)
		dev = ctx->dev;
	lock();
	va = do_alloc(kind, size, dev, kind == FAKE_CUDA_KIND_POOL ? NULL : ctx);
	unlock();
	return va;
}

/* ---- Control API: allocations --------------------------------------------------------------- */

EXPORT uint64_t fake_cuda_alloc(size_t size)
{
	return alloc_kind(FAKE_CUDA_KIND_DEVICE, size, -1, NULL);
}

EXPORT uint64_t fake_cuda_alloc_on(int dev, size_t size)
{
	if (dev < 0 || dev >= FAKE_CUDA_MAX_DEVICES)
		return 0;
	return alloc_kind(FAKE_CUDA_KIND_DEVICE, size, dev, &g_primary[dev]);
}

EXPORT uint64_t fake_cuda_alloc_async_on(int dev, size_t size)
{
	if (dev < 0 || dev >= FAKE_CUDA_MAX_DEVICES)
		return 0;
	return alloc_kind(FAKE_CUDA_KIND_POOL, size, dev, &g_primary[dev]);
}

EXPORT int fake_cuda_free(uint64_t va)
{
	return free_kind(va, K(DEVICE) | K(POOL) | K(MANAGED));
}

EXPORT uint64_t fake_cuda_alloc_async(size_t size)
{
	return alloc_kind(FAKE_CUDA_KIND_POOL, size, -1, NULL);
}

EXPORT int fake_cuda_free_async(uint64_t va)
{
	return free_kind(va, K(DEVICE) | K(POOL));
}

EXPORT uint64_t fake_cuda_alloc_managed(size_t size)
{
	return alloc_kind(FAKE_CUDA_KIND_MANAGED, size, -1, NULL);
}

EXPORT void *fake_cuda_alloc_host(size_t size)
{
	return (void *)(uintptr_t)alloc_kind(FAKE_CUDA_KIND_HOST, size, -1, NULL);
}

EXPORT int fake_cuda_free_host(void *p)
{
	return free_kind((uint64_t)(uintptr_t)p, K(HOST));
}

EXPORT uint64_t fake_cuda_vmm_reserve(size_t size)
{
	uint64_t rsize = ((uint64_t)size + CHUNK - 1) & ~(CHUNK - 1);
	uint64_t va = 0;

	if (size == 0 || size > ARENA_SIZE)
		return 0;
	lock();
	struct resv *r = calloc(1, sizeof(*r));

	if (r) {
		va = va_get(rsize);
		if (va) {
			r->sp = (struct span){ va, rsize };
			r->asked = size;
			if (vec_insert(&g_resvs, r)) {
				va_put(va, rsize);
				va = 0;
			}
		}
		if (!va)
			free(r);
	}
	unlock();
	return va;
}

/* The lock is held. */
int vmm_map(uint64_t va, uint64_t size, int dev)
{
	int ret = 0;

	if (size == 0 || va % CHUNK || size % CHUNK)
		return -EINVAL;
	struct resv *r = vec_find(&g_resvs, va);

	if (!r || va + size > r->sp.va + r->sp.size || va + size < va) {
		ret = -EINVAL;
		goto out;
	}
	for (uint64_t p = va; p < va + size; p += CHUNK) {
		if (vec_find(&g_chunks, p)) {
			ret = -EINVAL;
			goto out;
		}
	}
	ctx_used(NULL, dev);
	struct chunk *c = chunk_create(FAKE_CUDA_KIND_VMM, va, size, false, r, dev, NULL);

	if (!c) {
		ret = -ENOMEM;
		goto out;
	}
	if (!alloc_new(FAKE_CUDA_KIND_VMM, va, size, c, 0, 0)) {
		chunk_release(c);
		ret = -ENOMEM;
		goto out;
	}
	r->nmaps++;
out:
	return ret;
}

EXPORT int fake_cuda_vmm_map(uint64_t va, size_t size)
{
	CUcontext ctx = control_ctx();
	int ret;

	lock();
	ret = vmm_map(va, size, ctx->dev);
	unlock();
	return ret;
}

EXPORT int fake_cuda_vmm_unmap(uint64_t va, size_t size)
{
	struct freed fr[64];
	unsigned nfr = 0;
	int ret = 0;

	if (size == 0)
		return -EINVAL;
	lock();
	/* Check first: [va, va+size) must be exactly a run of whole mappings. */
	for (uint64_t p = va; p < va + size;) {
		struct alloc *a = find_alloc(p);

		if (!a || a->kind != FAKE_CUDA_KIND_VMM || a->sp.va != p ||
		    a->sp.va + a->sp.size > va + size) {
			ret = -EINVAL;
			goto out;
		}
		p += a->sp.size;
	}
	for (uint64_t p = va; p < va + size;) {
		struct alloc *a = find_alloc(p);
		uint64_t next = p + a->sp.size;

		do_free(a, nfr < 64 ? &fr[nfr++] : NULL);
		p = next;
	}
out:
	unlock();
	for (unsigned i = 0; i < nfr; i++)
		notify(&fr[i]);
	return ret;
}

EXPORT int fake_cuda_vmm_free(uint64_t va, size_t size)
{
	int ret = 0;

	lock();
	struct resv *r = vec_find(&g_resvs, va);

	if (!r || r->sp.va != va || (size != r->sp.size && size != r->asked)) {
		ret = -EINVAL;
	} else if (r->nmaps) {
		ret = -EBUSY;
	} else {
		vec_remove(&g_resvs, r);
		va_put(r->sp.va, r->sp.size);
		free(r);
	}
	unlock();
	return ret;
}

/* ---- Control API: inspection ---------------------------------------------------------------- */

EXPORT uint64_t fake_cuda_buffer_id(uint64_t va)
{
	uint64_t id = 0;

	lock();
	struct alloc *a = find_alloc(va);

	if (a)
		id = a->id;
	unlock();
	return id;
}

EXPORT int fake_cuda_alloc_info(uint64_t va, struct fake_cuda_alloc_info *out)
{
	int ret = -ENOENT;

	lock();
	struct alloc *a = find_alloc(va);

	if (a && out) {
		*out = (struct fake_cuda_alloc_info){
			.va = a->sp.va,
			.size = a->sp.size,
			.buffer_id = a->id,
			.kind = a->kind,
			.chunk_va = a->chunk->sp.va,
			.chunk_size = a->chunk->sp.size,
			.reservation_va = a->chunk->resv ? a->chunk->resv->sp.va : 0,
			.reservation_size = a->chunk->resv ? a->chunk->resv->sp.size : 0,
			.sync_memops_count = a->sync_count,
			.sync_memops = a->sync,
			.device = a->dev,
			.context = a->ctx,
		};
		ret = 0;
	}
	unlock();
	return ret;
}

EXPORT unsigned fake_cuda_sync_memops_count(uint64_t va)
{
	unsigned n = 0;

	lock();
	struct alloc *a = find_alloc(va);

	if (a)
		n = a->sync_count;
	unlock();
	return n;
}

EXPORT uint64_t fake_cuda_phys_gen(uint64_t va)
{
	uint64_t gen = 0;

	lock();
	struct chunk *c = vec_find(&g_chunks, va);

	if (c && kind_is_gpu(c->kind))
		gen = c->block_id;
	unlock();
	return gen;
}

EXPORT unsigned fake_cuda_live_allocations(void)
{
	unsigned n;

	lock();
	n = (unsigned)g_allocs.n;
	unlock();
	return n;
}

EXPORT unsigned fake_cuda_live_chunks(void)
{
	unsigned n;

	lock();
	n = (unsigned)g_chunks.n;
	unlock();
	return n;
}

EXPORT uint64_t fake_cuda_last_buffer_id(void)
{
	uint64_t id;

	lock();
	id = g_last_id;
	unlock();
	return id;
}

static int entry_lookup(const char *name)
{
	if (!name)
		return -1;
	for (int e = 0; e < E_COUNT; e++) {
		size_t len = strlen(name);

		if (!strcmp(entry_name[e], name))
			return e;
		/* base name of a _v2 entry */
		if (!strncmp(entry_name[e], name, len) && !strcmp(entry_name[e] + len, "_v2") &&
		    e != E_cuGetProcAddress_v2)
			return e;
	}
	return -1;
}

EXPORT uint64_t fake_cuda_calls(const char *entry)
{
	int e = entry_lookup(entry);

	return e < 0 ? 0 : atomic_load(&g_calls[e]);
}

EXPORT uint64_t fake_cuda_calls_total(void)
{
	uint64_t t = 0;

	for (int e = 0; e < E_COUNT; e++)
		t += atomic_load(&g_calls[e]);
	return t;
}

EXPORT void fake_cuda_reset_counters(void)
{
	for (int e = 0; e < E_COUNT; e++)
		atomic_store(&g_calls[e], 0);
}

#define DMABUF_NAME "fake-dmabuf"

EXPORT int fake_cuda_open_dmabufs(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *de;
	int n = 0;

	if (!d)
		return -errno;
	while ((de = readdir(d))) {
		char path[sizeof("/proc/self/fd/") + sizeof(de->d_name)], target[PATH_MAX];
		ssize_t len;

		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
		len = readlink(path, target, sizeof(target) - 1);
		if (len <= 0)
			continue;
		target[len] = '\0';
		if (strstr(target, "memfd:" DMABUF_NAME))
			n++;
	}
	closedir(d);
	return n;
}

EXPORT int fake_cuda_dmabuf_range(int fd, uint64_t *va, uint64_t *size)
{
	char path[64], target[PATH_MAX];
	unsigned long long v, s;
	ssize_t len;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	len = readlink(path, target, sizeof(target) - 1);
	if (len <= 0)
		return -EBADF;
	target[len] = '\0';

	const char *m = strstr(target, "memfd:" DMABUF_NAME ":");

	if (!m || sscanf(m + strlen("memfd:" DMABUF_NAME ":"), "%llx+%llx", &v, &s) != 2)
		return -EINVAL;
	if (va)
		*va = v;
	if (size)
		*size = s;
	return 0;
}

EXPORT uint64_t fake_cuda_dmabuf_exports(void)
{
	uint64_t n;

	lock();
	n = g_dmabuf_exports;
	unlock();
	return n;
}

/* ---- Control API: switches and faults ------------------------------------------------------- */

EXPORT int fake_cuda_fail_after(const char *entry, unsigned skip, int curesult, unsigned n)
{
	int e = entry_lookup(entry);

	if (e < 0)
		return -EINVAL;
	lock();
	struct fault *f = &g_faults[e];

	if (f->n)
		atomic_fetch_sub(&g_faults_armed, 1);
	*f = (struct fault){ .skip = skip, .n = n, .result = curesult };
	if (n)
		atomic_fetch_add(&g_faults_armed, 1);
	unlock();
	return 0;
}

EXPORT int fake_cuda_fail_next(const char *entry, int curesult, unsigned n)
{
	return fake_cuda_fail_after(entry, 0, curesult, n);
}

EXPORT int fake_cuda_hide_symbol(const char *name)
{
	int ret = 0;

	if (!name || strlen(name) >= sizeof(g_hidden[0]))
		return -EINVAL;
	lock();
	if (g_nhidden == sizeof(g_hidden) / sizeof(g_hidden[0]))
		ret = -ENOSPC;
	else
		strcpy(g_hidden[g_nhidden++], name);
	unlock();
	return ret;
}

EXPORT int fake_cuda_set_symbol_min_version(const char *name, int version)
{
	int e = entry_lookup(name);

	if (e < 0)
		return -EINVAL;
	lock();
	g_min_version_override[e] = version;
	unlock();
	return 0;
}

EXPORT void fake_cuda_set_init_error(int curesult)
{
	lock();
	g_init_error = curesult;
	unlock();
}

EXPORT void fake_cuda_deinit(void)
{
	atomic_store(&g_initialized, false);
}

EXPORT bool fake_cuda_initialized(void)
{
	return atomic_load(&g_initialized);
}

EXPORT void fake_cuda_set_driver_version(int version)
{
	lock();
	g_driver_version = version;
	unlock();
}

EXPORT void fake_cuda_force_new_va(bool on)
{
	lock();
	g_force_new_va = on;
	unlock();
}

EXPORT void fake_cuda_set_enter_hook(void (*cb)(const char *entry, void *arg), void *arg)
{
	atomic_store(&g_enter_hook_arg, arg);
	atomic_store(&g_enter_hook, cb);
}

EXPORT void fake_cuda_set_free_observer(fake_cuda_free_observer_t cb, void *arg)
{
	lock();
	g_observer = cb;
	g_observer_arg = arg;
	unlock();
}

EXPORT int fake_cuda_sim_fd(void)
{
	pthread_once(&g_once, state_init);
	return g_sim_fd;
}

EXPORT uint64_t fake_cuda_sim_id(uint64_t va)
{
	uint64_t id = 0;

	lock();
	struct chunk *c = vec_find(&g_chunks, va);

	if (c)
		id = c->sim_id;
	unlock();
	return id;
}

EXPORT void fake_cuda_reset(void)
{
	lock();
	while (g_allocs.n)
		do_free((struct alloc *)g_allocs.v[g_allocs.n - 1], NULL);
	while (g_chunks.n) /* none should remain; be safe */
		chunk_release((struct chunk *)g_chunks.v[g_chunks.n - 1]);
	while (g_resvs.n) {
		struct resv *r = (struct resv *)g_resvs.v[g_resvs.n - 1];

		vec_remove(&g_resvs, r);
		va_put(r->sp.va, r->sp.size);
		free(r);
	}
	memset(g_faults, 0, sizeof(g_faults));
	atomic_store(&g_faults_armed, 0);
	g_nhidden = 0;
	memset(g_min_version_override, 0, sizeof(g_min_version_override));
	pool_reset();
	ipc_reset();
	ctx_reset_state();
	g_init_error = CUDA_SUCCESS;
	g_force_new_va = false;
	g_observer = NULL;
	g_observer_arg = NULL;
	g_driver_version = FAKE_CUDA_DRIVER_VERSION;
	g_dmabuf_exports = 0;
	unlock();
	fake_cuda_reset_counters();
}

/* ---- Driver entry points -------------------------------------------------------------------- */

EXPORT CUresult cuInit(unsigned int flags)
{
	CUresult rc;

	ENTER(cuInit, false);
	if (flags)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	rc = g_init_error;
	unlock();
	if (rc == CUDA_SUCCESS)
		atomic_store(&g_initialized, true);
	return rc;
}

EXPORT CUresult cuDriverGetVersion(int *version)
{
	ENTER(cuDriverGetVersion, false);
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	*version = g_driver_version;
	unlock();
	return CUDA_SUCCESS;
}

static const struct {
	CUresult code;
	const char *name;
	const char *text;
} g_errors[] = {
	{ 0, "CUDA_SUCCESS", "no error" },
	{ 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ 3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ 4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down" },
	{ 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected" },
	{ 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ 201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ 500, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ 800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted" },
	{ 801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ 999, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

static CUresult error_lookup(CUresult error, const char **str, bool name)
{
	if (!str)
		return CUDA_ERROR_INVALID_VALUE;
	for (size_t i = 0; i < sizeof(g_errors) / sizeof(g_errors[0]); i++) {
		if (g_errors[i].code == error) {
			*str = name ? g_errors[i].name : g_errors[i].text;
			return CUDA_SUCCESS;
		}
	}
	*str = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char **str)
{
	ENTER(cuGetErrorName, false);
	return error_lookup(error, str, true);
}

EXPORT CUresult cuGetErrorString(CUresult error, const char **str)
{
	ENTER(cuGetErrorString, false);
	return error_lookup(error, str, false);
}

/* One attribute of ptr into data. a: the allocation holding ptr, or NULL when unknown (then, in a
 * cuPointerGetAttributes call, the unknown-pointer defaults). The lock is held. */
static CUresult attr_get(const struct alloc *a, uint64_t ptr, int attr, void *data, bool multi)
{
	const struct resv *r = NULL;
	int kind = a ? a->kind : FAKE_CUDA_KIND_NONE;
	bool vmm = kind == FAKE_CUDA_KIND_VMM;
	/* The chunk holding ptr itself: a pool allocation spans several (measured, H200). */
	const struct chunk *c = a ? vec_find(&g_chunks, ptr) : NULL;

	if (!a) {
		if (!multi)
			return CUDA_ERROR_INVALID_VALUE;
		r = vec_find(&g_resvs, ptr);
	} else if (vmm) {
		r = a->chunk->resv;
	}

#define PUT(type, value) (*(type *)data = (type)(value))
	switch (attr) {
	case ATTR_CONTEXT:
		PUT(CUcontext, a ? a->ctx : NULL);
		break;
	case ATTR_MEMORY_TYPE:
		PUT(unsigned int, !a ? 0 : kind == FAKE_CUDA_KIND_HOST ? MEMORYTYPE_HOST
								   : MEMORYTYPE_DEVICE);
		break;
	case ATTR_DEVICE_POINTER:
		if (a && !has_context()) {
			if (!multi)
				return CUDA_ERROR_INVALID_CONTEXT;
			a = NULL;
		}
		PUT(CUdeviceptr, a ? ptr : 0);
		break;
	case ATTR_HOST_POINTER:
		if (a && kind != FAKE_CUDA_KIND_HOST && kind != FAKE_CUDA_KIND_MANAGED) {
			if (!multi)
				return CUDA_ERROR_INVALID_VALUE;
			PUT(void *, NULL);
		} else {
			PUT(void *, (uintptr_t)ptr);
		}
		break;
	case ATTR_P2P_TOKENS: {
		struct {
			unsigned long long p2pToken;
			unsigned int vaSpaceToken;
		} *t = data;
		t->p2pToken = c ? c->block_id : 0;
		t->vaSpaceToken = a ? 1 : 0;
		break;
	}
	case ATTR_SYNC_MEMOPS:
		PUT(unsigned int, a && a->sync);
		break;
	case ATTR_BUFFER_ID:
		PUT(unsigned long long, a ? a->id : 0);
		break;
	case ATTR_IS_MANAGED:
		PUT(unsigned int, kind == FAKE_CUDA_KIND_MANAGED);
		break;
	case ATTR_DEVICE_ORDINAL:
		PUT(int, a ? a->dev : -2);
		break;
	case ATTR_IS_LEGACY_CUDA_IPC_CAPABLE:
		PUT(unsigned int, kind == FAKE_CUDA_KIND_DEVICE);
		break;
	case ATTR_RANGE_START_ADDR:
		if (r)
			PUT(CUdeviceptr, r->sp.va);
		else if (a)
			PUT(CUdeviceptr, a->sp.va);
		break; /* unknown pointer: left untouched, as measured */
	case ATTR_RANGE_SIZE:
		if (r)
			PUT(size_t, r->sp.size);
		else if (a)
			PUT(size_t, a->sp.size);
		break;
	case ATTR_MAPPED:
		PUT(unsigned int, a != NULL);
		break;
	case ATTR_ALLOWED_HANDLE_TYPES:
		PUT(unsigned long long, 0);
		break;
	case ATTR_IS_GPU_DIRECT_RDMA_CAPABLE:
		PUT(unsigned int, kind == FAKE_CUDA_KIND_DEVICE || vmm);
		break;
	case ATTR_ACCESS_FLAGS:
		PUT(unsigned int, a ? 3 : 0); /* CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE */
		break;
	case ATTR_MEMPOOL_HANDLE:
		PUT(void *, kind == FAKE_CUDA_KIND_POOL ? &g_pool_handle[a->dev] : NULL);
		break;
	case ATTR_MAPPING_SIZE:
		PUT(size_t, c ? c->sp.size : 0);
		break;
	case ATTR_MAPPING_BASE_ADDR:
		PUT(CUdeviceptr, c ? c->sp.va : 0);
		break;
	case ATTR_MEMORY_BLOCK_ID:
		PUT(unsigned long long, c ? c->block_id : 0);
		break;
	case ATTR_IS_HW_DECOMPRESS_CAPABLE:
		PUT(unsigned int, 0);
		break;
	default:
		return CUDA_ERROR_INVALID_VALUE;
	}
#undef PUT
	return CUDA_SUCCESS;
}

EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
	CUresult rc;

	ENTER(cuPointerGetAttribute, true);
	if (!data || attribute < 1 || attribute > ATTR_LAST)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	rc = attr_get(find_alloc(ptr), ptr, attribute, data, false);
	unlock();
	return rc;
}

EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, int *attributes, void **data,
				       CUdeviceptr ptr)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuPointerGetAttributes, true);
	if (numAttributes == 0 || !attributes || !data)
		return CUDA_ERROR_INVALID_VALUE;
	for (unsigned i = 0; i < numAttributes; i++)
		if (attributes[i] < 1 || attributes[i] > ATTR_LAST || !data[i])
			return CUDA_ERROR_INVALID_VALUE;
	lock();
	const struct alloc *a = find_alloc(ptr);

	for (unsigned i = 0; i < numAttributes && rc == CUDA_SUCCESS; i++)
		rc = attr_get(a, ptr, attributes[i], data[i], true);
	unlock();
	return rc;
}

EXPORT CUresult cuPointerSetAttribute(const void *value, int attribute, CUdeviceptr ptr)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuPointerSetAttribute, true);
	if (!value || attribute != ATTR_SYNC_MEMOPS)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	struct alloc *a = find_alloc(ptr);

	if (!a) {
		rc = CUDA_ERROR_INVALID_VALUE;
	} else if (a->kind == FAKE_CUDA_KIND_VMM) {
		rc = CUDA_ERROR_NOT_SUPPORTED;
	} else {
		/* cuda.h: the value is an unsigned int (0 or 1); any value was accepted (measured) */
		a->sync = *(const unsigned int *)value != 0;
		a->sync_count++;
	}
	unlock();
	return rc;
}

EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	CUresult rc = CUDA_SUCCESS;

	ENTER(cuMemGetAddressRange_v2, true);
	if (!has_context())
		return CUDA_ERROR_INVALID_CONTEXT;
	lock();
	struct alloc *a = find_alloc(dptr);

	if (!a) {
		rc = CUDA_ERROR_NOT_FOUND;
	} else {
		if (pbase)
			*pbase = a->sp.va;
		if (psize)
			*psize = a->sp.size;
	}
	unlock();
	return rc;
}

EXPORT CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
					      int handleType, unsigned long long flags)
{
	CUresult rc = CUDA_SUCCESS;
	char name[80];
	int fd;

	ENTER(cuMemGetHandleForAddressRange, true);
	if (!handle || handleType != DMA_BUF_FD)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags)
		return CUDA_ERROR_NOT_SUPPORTED;
	if (!has_context())
		return CUDA_ERROR_INVALID_CONTEXT;
	if (size == 0 || dptr % PAGE || size % PAGE || dptr + size < dptr)
		return CUDA_ERROR_INVALID_VALUE;
	lock();
	rc = export_check(dptr, size);
	if (rc)
		goto out;
	snprintf(name, sizeof(name), DMABUF_NAME ":%llx+%zx", dptr, size);
	fd = memfd_create(name, MFD_CLOEXEC);
	if (fd < 0) {
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	if (ftruncate(fd, (off_t)size)) {
		close(fd);
		rc = CUDA_ERROR_OUT_OF_MEMORY;
		goto out;
	}
	*(int *)handle = fd;
	export_record(fd, dptr, size);
	g_dmabuf_exports++;
out:
	unlock();
	return rc;
}

/* An entry point's allocation, in the current context, on its device (POOL: on dev, or the
 * current context's device when dev < 0). */
CUresult entry_alloc(int kind, CUdeviceptr *dptr, size_t size, int dev)
{
	CUcontext ctx = current_ctx();
	uint64_t va;

	if (!dptr)
		return CUDA_ERROR_INVALID_VALUE;
	*dptr = 0;
	if (!ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (size == 0)
		return CUDA_ERROR_INVALID_VALUE;
	va = alloc_kind(kind, size, dev, ctx);
	if (!va)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*dptr = va;
	return CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAlloc_v2)(CUdeviceptr *dptr, size_t bytesize)
{
	ENTER(cuMemAlloc_v2, true);
	return entry_alloc(FAKE_CUDA_KIND_DEVICE, dptr, bytesize, -1);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemFree_v2)(CUdeviceptr dptr)
{
	ENTER(cuMemFree_v2, true);
	return fake_cuda_free(dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Copies between host memory and fake device memory, which the CPU can reach: the range must lie
 * in one live allocation, as the real driver requires of a device pointer range. */
static CUresult copy_check(CUdeviceptr d, size_t n)
{
	struct alloc *a;
	CUresult rc = CUDA_SUCCESS;

	lock();
	a = find_alloc(d);
	if (!a || !(kind_is_gpu(a->kind) || a->kind == FAKE_CUDA_KIND_IPC) ||
	    d + n > a->sp.va + a->sp.size)
		rc = CUDA_ERROR_INVALID_VALUE;
	unlock();
	return rc;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
	CUresult rc;

	ENTER(cuMemcpyHtoD_v2, true);
	rc = copy_check(dst, n);
	if (!rc)
		memcpy((void *)(uintptr_t)dst, src, n);
	return rc;
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
	CUresult rc;

	ENTER(cuMemcpyDtoH_v2, true);
	rc = copy_check(src, n);
	if (!rc)
		memcpy(dst, (const void *)(uintptr_t)src, n);
	return rc;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocHost_v2)(void **pp, size_t bytesize)
{
	CUdeviceptr d;
	CUresult rc;

	ENTER(cuMemAllocHost_v2, true);
	if (!pp)
		return CUDA_ERROR_INVALID_VALUE;
	rc = entry_alloc(FAKE_CUDA_KIND_HOST, &d, bytesize, -1);
	*pp = (void *)(uintptr_t)d;
	return rc;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemFreeHost)(void *p)
{
	ENTER(cuMemFreeHost, true);
	return fake_cuda_free_host(p) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocManaged)(CUdeviceptr *dptr, size_t bytesize,
						   unsigned int flags)
{
	ENTER(cuMemAllocManaged, true);
	if (flags != 1 && flags != 2) /* CU_MEM_ATTACH_GLOBAL, CU_MEM_ATTACH_HOST */
		return CUDA_ERROR_INVALID_VALUE;
	return entry_alloc(FAKE_CUDA_KIND_MANAGED, dptr, bytesize, -1);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocAsync)(CUdeviceptr *dptr, size_t bytesize,
						 CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemAllocAsync, true);
	return entry_alloc(FAKE_CUDA_KIND_POOL, dptr, bytesize, -1);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemFreeAsync)(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemFreeAsync, true);
	return fake_cuda_free_async(dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemAllocAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize,
						      CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemAllocAsync_ptsz, true);
	return entry_alloc(FAKE_CUDA_KIND_POOL, dptr, bytesize, -1);
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemFreeAsync_ptsz)(CUdeviceptr dptr, CUstream hStream)
{
	(void)hStream;
	ENTER(cuMemFreeAsync_ptsz, true);
	return fake_cuda_free_async(dptr) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

ENTRY_EXPORT CUresult ENTRY_FN(cuMemUnmap)(CUdeviceptr ptr, size_t size)
{
	ENTER(cuMemUnmap, true);
	return fake_cuda_vmm_unmap(ptr, size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* ---- cuGetProcAddress ----------------------------------------------------------------------- */

/* The exported entries (the assembly prologues): what cuGetProcAddress hands out, as dlsym does. */
#define X(n) EXPORT __typeof__(ENTRY_FN(n)) n;
FAKE_PATCHED_ENTRIES(X)
#undef X

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus);

static const struct {
	const char *base;
	enum entry e;
	void *fn;
	int min_version; /* the CUDA version that introduced it */
	void *ptsz;      /* the PER_THREAD_DEFAULT_STREAM variant, if any */
	void *v1;        /* the variant below v2_from, if any */
	int v2_from;
} g_procs[] = {
	{ "cuGetProcAddress", E_cuGetProcAddress_v2, (void *)cuGetProcAddress_v2, 11030,
	  .v1 = (void *)cuGetProcAddress, .v2_from = 12000 },
	{ "cuInit", E_cuInit, (void *)cuInit, 2000, NULL, NULL, 0 },
	{ "cuDriverGetVersion", E_cuDriverGetVersion, (void *)cuDriverGetVersion, 2020, NULL, NULL, 0 },
	{ "cuGetErrorName", E_cuGetErrorName, (void *)cuGetErrorName, 6000, NULL, NULL, 0 },
	{ "cuGetErrorString", E_cuGetErrorString, (void *)cuGetErrorString, 6000, NULL, NULL, 0 },
	{ "cuDeviceGet", E_cuDeviceGet, (void *)cuDeviceGet, 2000, NULL, NULL, 0 },
	{ "cuDeviceGetCount", E_cuDeviceGetCount, (void *)cuDeviceGetCount, 2000, NULL, NULL, 0 },
	{ "cuDeviceGetAttribute", E_cuDeviceGetAttribute, (void *)cuDeviceGetAttribute, 2000, NULL, NULL, 0 },
	{ "cuCtxGetCurrent", E_cuCtxGetCurrent, (void *)cuCtxGetCurrent, 4000, NULL, NULL, 0 },
	{ "cuCtxSetCurrent", E_cuCtxSetCurrent, (void *)cuCtxSetCurrent, 4000, NULL, NULL, 0 },
	{ "cuCtxGetDevice", E_cuCtxGetDevice, (void *)cuCtxGetDevice, 2000, NULL, NULL, 0 },
	{ "cuMemcpyHtoD", E_cuMemcpyHtoD_v2, (void *)cuMemcpyHtoD_v2, 3020, NULL, NULL, 0 },
	{ "cuMemcpyDtoH", E_cuMemcpyDtoH_v2, (void *)cuMemcpyDtoH_v2, 3020, NULL, NULL, 0 },
	{ "cuDevicePrimaryCtxRetain", E_cuDevicePrimaryCtxRetain, (void *)cuDevicePrimaryCtxRetain,
	  7000, NULL, NULL, 0 },
	{ "cuCtxGetFlags", E_cuCtxGetFlags, (void *)cuCtxGetFlags, 7000, NULL, NULL, 0 },
	{ "cuCtxSetFlags", E_cuCtxSetFlags, (void *)cuCtxSetFlags, 12010, NULL, NULL, 0 },
	{ "cuPointerGetAttribute", E_cuPointerGetAttribute, (void *)cuPointerGetAttribute, 4000, NULL, NULL, 0 },
	{ "cuPointerGetAttributes", E_cuPointerGetAttributes, (void *)cuPointerGetAttributes, 7000, NULL, NULL, 0 },
	{ "cuPointerSetAttribute", E_cuPointerSetAttribute, (void *)cuPointerSetAttribute, 6000, NULL, NULL, 0 },
	{ "cuMemGetAddressRange", E_cuMemGetAddressRange_v2, (void *)cuMemGetAddressRange_v2, 3020, NULL, NULL, 0 },
	{ "cuMemGetHandleForAddressRange", E_cuMemGetHandleForAddressRange,
	  (void *)cuMemGetHandleForAddressRange, 11070, NULL, NULL, 0 },
	{ "cuMemAlloc", E_cuMemAlloc_v2, (void *)cuMemAlloc_v2, 3020, NULL, NULL, 0 },
	{ "cuMemFree", E_cuMemFree_v2, (void *)cuMemFree_v2, 3020, NULL, NULL, 0 },
	{ "cuMemAllocHost", E_cuMemAllocHost_v2, (void *)cuMemAllocHost_v2, 3020, NULL, NULL, 0 },
	{ "cuMemFreeHost", E_cuMemFreeHost, (void *)cuMemFreeHost, 2000, NULL, NULL, 0 },
	{ "cuMemAllocManaged", E_cuMemAllocManaged, (void *)cuMemAllocManaged, 6000, NULL, NULL, 0 },
	{ "cuMemAllocAsync", E_cuMemAllocAsync, (void *)cuMemAllocAsync, 11020,
	  .ptsz = (void *)cuMemAllocAsync_ptsz },
	{ "cuMemFreeAsync", E_cuMemFreeAsync, (void *)cuMemFreeAsync, 11020,
	  .ptsz = (void *)cuMemFreeAsync_ptsz },
	{ "cuMemUnmap", E_cuMemUnmap, (void *)cuMemUnmap, 10020, NULL, NULL, 0 },
	{ "cuCtxDestroy", E_cuCtxDestroy_v2, (void *)cuCtxDestroy_v2, 2000,
	  .v1 = (void *)cuCtxDestroy, .v2_from = 4000 },
	{ "cuDevicePrimaryCtxReset", E_cuDevicePrimaryCtxReset_v2, (void *)cuDevicePrimaryCtxReset_v2,
	  7000, .v1 = (void *)cuDevicePrimaryCtxReset, .v2_from = 11000 },
	{ "cuDevicePrimaryCtxRelease", E_cuDevicePrimaryCtxRelease_v2,
	  (void *)cuDevicePrimaryCtxRelease_v2, 7000, .v1 = (void *)cuDevicePrimaryCtxRelease,
	  .v2_from = 11000 },
	{ "cuIpcOpenMemHandle", E_cuIpcOpenMemHandle_v2, (void *)cuIpcOpenMemHandle_v2, 11000, NULL, NULL, 0 },
	{ "cuIpcCloseMemHandle", E_cuIpcCloseMemHandle, (void *)cuIpcCloseMemHandle, 4010, NULL, NULL, 0 },
	{ "cuIpcGetMemHandle", E_cuIpcGetMemHandle, (void *)cuIpcGetMemHandle, 4010, NULL, NULL, 0 },
	{ "cuDevicePrimaryCtxGetState", E_cuDevicePrimaryCtxGetState,
	  (void *)cuDevicePrimaryCtxGetState, 7000, NULL, NULL, 0 },
	{ "cuCtxPushCurrent", E_cuCtxPushCurrent_v2, (void *)cuCtxPushCurrent_v2, 4000, NULL, NULL, 0 },
	{ "cuCtxPopCurrent", E_cuCtxPopCurrent_v2, (void *)cuCtxPopCurrent_v2, 4000, NULL, NULL, 0 },
	{ "cuCtxCreate", E_cuCtxCreate_v2, (void *)cuCtxCreate_v2, 3020, NULL, NULL, 0 },
	{ "cuDeviceGetDefaultMemPool", E_cuDeviceGetDefaultMemPool, (void *)cuDeviceGetDefaultMemPool,
	  11020, NULL, NULL, 0 },
	{ "cuMemAllocFromPoolAsync", E_cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync, 11020,
	  NULL, NULL, 0 },
	{ "cuMemCreate", E_cuMemCreate, (void *)cuMemCreate, 10020, NULL, NULL, 0 },
	{ "cuMemRelease", E_cuMemRelease, (void *)cuMemRelease, 10020, NULL, NULL, 0 },
	{ "cuMemAddressReserve", E_cuMemAddressReserve, (void *)cuMemAddressReserve, 10020, NULL, NULL, 0 },
	{ "cuMemAddressFree", E_cuMemAddressFree, (void *)cuMemAddressFree, 10020, NULL, NULL, 0 },
	{ "cuMemMap", E_cuMemMap, (void *)cuMemMap, 10020, NULL, NULL, 0 },
	{ "cuMemSetAccess", E_cuMemSetAccess, (void *)cuMemSetAccess, 10020, NULL, NULL, 0 },
	{ "cuMemGetAllocationGranularity", E_cuMemGetAllocationGranularity,
	  (void *)cuMemGetAllocationGranularity, 10020, NULL, NULL, 0 },
	{ "cuMemExportToShareableHandle", E_cuMemExportToShareableHandle,
	  (void *)cuMemExportToShareableHandle, 10020, NULL, NULL, 0 },
	{ "cuMemImportFromShareableHandle", E_cuMemImportFromShareableHandle,
	  (void *)cuMemImportFromShareableHandle, 10020, NULL, NULL, 0 },
};

/* Returns PROC_* and the function. The lock is not held. */
static int proc_find(const char *symbol, int version, cuuint64_t flags, void **fn)
{
	int status = PROC_SYMBOL_NOT_FOUND;

	*fn = NULL;
	lock();
	for (unsigned i = 0; i < g_nhidden; i++)
		if (!strcmp(g_hidden[i], symbol))
			goto out;
	for (size_t i = 0; i < sizeof(g_procs) / sizeof(g_procs[0]); i++) {
		if (strcmp(g_procs[i].base, symbol))
			continue;
		int min = g_min_version_override[g_procs[i].e];

		if (!min)
			min = g_procs[i].min_version;

		if (version < min) {
			status = PROC_VERSION_NOT_SUFFICIENT;
		} else {
			status = PROC_SUCCESS;
			*fn = g_procs[i].fn;
			if (g_procs[i].v1 && version < g_procs[i].v2_from)
				*fn = g_procs[i].v1;
			if (g_procs[i].ptsz && (flags & 2))
				*fn = g_procs[i].ptsz;
		}
		break;
	}
out:
	unlock();
	return status;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	ENTER(cuGetProcAddress_v2, false);
	if (!symbol || !pfn)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags > 2) { /* DEFAULT, LEGACY_STREAM, PER_THREAD_DEFAULT_STREAM */
		*pfn = NULL;
		if (symbolStatus)
			*symbolStatus = PROC_SYMBOL_NOT_FOUND;
		return CUDA_ERROR_INVALID_VALUE;
	}

	int status = proc_find(symbol, cudaVersion, flags, pfn);

	if (symbolStatus)
		*symbolStatus = status;
	return CUDA_SUCCESS; /* measured: success even when not found; look at *pfn / status */
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
	void *fn;

	ENTER(cuGetProcAddress, false);
	if (!symbol || !pfn || flags > 2)
		return CUDA_ERROR_INVALID_VALUE;
	if (proc_find(symbol, cudaVersion, flags, &fn) != PROC_SUCCESS)
		return CUDA_ERROR_NOT_FOUND; /* *pfn untouched, as measured */
	*pfn = fn;
	return CUDA_SUCCESS;
}
