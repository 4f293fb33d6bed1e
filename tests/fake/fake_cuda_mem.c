/* SPDX-License-Identifier: MIT */
/*
 * The fake CUDA driver's memory model: its state and lock, sorted vectors of spans, the VA arena
 * (PROT_NONE until a chunk makes pages read-write), and chunks: the physical memory allocations,
 * VMM mappings and pool chunks live in, with the P2P provider (FAKE_CUDA_P2P_SIM) told of each
 * GPU chunk.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda_internal.h"
#include "nvp2p_sim_uapi.h"

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static uint64_t g_arena_base, g_arena_end, g_arena_bump;
static struct span *g_free_va; /* freed chunk VA ranges, LIFO */
static size_t g_nfree_va, g_cap_free_va;
struct vec g_allocs, g_chunks, g_resvs;
static uint64_t g_next_block = 1;
bool g_force_new_va;
int g_pool_handle[FAKE_CUDA_MAX_DEVICES];
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

/* ---- Control API ---------------------------------------------------------------------------- */

EXPORT void fake_cuda_force_new_va(bool on)
{
	lock();
	g_force_new_va = on;
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

/* The lock is held; every allocation is gone. */
void mem_reset(void)
{
	while (g_chunks.n) /* none should remain; be safe */
		chunk_release((struct chunk *)g_chunks.v[g_chunks.n - 1]);
	g_force_new_va = false;
}
