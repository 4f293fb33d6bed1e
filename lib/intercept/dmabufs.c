/* SPDX-License-Identifier: MIT */
/*
 * Which GPU range a dma-buf fd holds. Stacks on upstream kernels register GPU memory as NCCL does
 * (src/transport/net_ib): cuMemGetHandleForAddressRange(DMA_BUF_FD) of the range, a new fd each
 * time, ibv_reg_dmabuf_mr(pd, offset, length, iova, fd), close(fd). The verbs call names no
 * address (iova is the caller's free choice), so the range is learnt where it is certain: the
 * export hook (hooks.c) records, for every dma-buf the driver exports for the program, the dma-buf's
 * identity (st_dev and st_ino of its fd: each dma-buf is an inode of its own, which every fd of it,
 * and only those, share; unlike the fd number, which the next open reuses) with the range and the
 * BUFFER_ID of the allocation at its start. A registration is vouched for (gdr_dmabufs_lookup) only
 * if its fd's inode was recorded, its size is the same, the free events are proven and no free of
 * the memory came since, and the allocation at the range is still the one exported (BUFFER_ID):
 * then registering the range by address pins the very memory the dma-buf holds. Anything else (a
 * dma-buf exported before the interception began, another process's, another driver's, a file
 * that is no dma-buf) is not found and passes through.
 *
 * The records are a ring of GDR_DMABUF_RECS, newest first when looked up (NCCL registers the fd it
 * just exported), each trusted for gdr_dmabufs_ttl_ns; the oldest is forgotten when a new one needs
 * its slot, so their memory is fixed and a program exporting without end costs nothing more. A
 * registration whose record went passes through, which is always right. A free scans them (only
 * while any is held).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "common/defs.h"
#include "cuda/cuda.h"
#include "intercept/dmabufs.h"
#include "intercept/events.h"
#include "intercept/hooks.h"

#define GDR_DMABUF_RECS 1024u

struct rec {
	uint64_t ino, dev, st_size; /* the dma-buf (its fd's fstat at the export); ino 0: free */
	uint64_t va, size;          /* the range exported */
	uint64_t lo, hi; /* what a free must touch to end it: the range and its allocation */
	uint64_t buffer_id;
	uint64_t gen;  /* the slot's use: a lookup forgets what it found only if it is still that */
	uint64_t t_ns; /* when it was recorded (CLOCK_MONOTONIC) */
};

/* How long a record is trusted. The inode number that identifies a dma-buf is unique among open
 * files, but the kernel's counter for pseudo files (pipes, sockets, anonymous inodes) wraps at
 * 2^32: once this dma-buf is closed, a much later one (another process's, passed to this one) could
 * carry its number and size. Within a minute of the export no counter wraps; registrations come
 * right after the export (NCCL, UCX, NIXL: then the fd is closed). */
uint64_t gdr_dmabufs_ttl_ns = 60ull * 1000000000;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000 + (uint64_t)ts.tv_nsec;
}

static struct {
	pthread_mutex_t lock;
	struct rec r[GDR_DMABUF_RECS];
	unsigned next; /* the slot the next record takes */
	unsigned live;
	uint64_t gen;
	struct gdr_dmabufs_counts n;
} t = { .lock = PTHREAD_MUTEX_INITIALIZER };

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void)
{
	pthread_mutex_lock(&t.lock);
}

static void fork_parent(void)
{
	pthread_mutex_unlock(&t.lock);
}

/* A child of fork() has no CUDA context of its parent's: nothing it registers is vouched for. */
static void fork_child(void)
{
	memset(t.r, 0, sizeof(t.r));
	__atomic_store_n(&t.live, 0, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&t.lock);
}

static void fork_handlers(void)
{
	(void)pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void forget(struct rec *r)
{
	r->ino = 0;
	__atomic_store_n(&t.live, t.live - 1, __ATOMIC_RELAXED); /* read unlocked by a free */
}

void gdr_dmabufs_exported(int fd, uint64_t va, uint64_t size, uint64_t id0)
{
	struct gdr_ptr_info info;
	struct stat st;
	struct rec *r;

	/* The allocation at va after the export must be the one before it: a free and a new
	 * allocation in between (another thread's) would leave the dma-buf on memory the address no
	 * longer holds. */
	if (!id0 || fstat(fd, &st) || gdr_cuda_classify(va, &info) || info.buffer_id != id0 ||
	    !st.st_ino)
		return;
	pthread_once(&fork_once, fork_handlers);
	pthread_mutex_lock(&t.lock);
	r = &t.r[t.next];
	t.next = (t.next + 1) % GDR_DMABUF_RECS;
	if (r->ino) {
		forget(r);
		t.n.evicted++;
	}
	*r = (struct rec){
		.ino = st.st_ino,
		.dev = st.st_dev,
		.st_size = (uint64_t)st.st_size,
		.va = va,
		.size = size,
		.lo = info.size && info.start < va ? info.start : va,
		.hi = info.size && info.start + info.size > va + size ? info.start + info.size
								      : va + size,
		.buffer_id = id0,
		.gen = ++t.gen,
		.t_ns = now_ns(),
	};
	__atomic_store_n(&t.live, t.live + 1, __ATOMIC_RELAXED);
	t.n.recorded++;
	pthread_mutex_unlock(&t.lock);
}

void gdr_dmabufs_drop(uint64_t start, uint64_t len)
{
	uint64_t end = len == GDR_EVENT_ALL_LEN ? UINT64_MAX : start + (len ? len : 1);

	if (!__atomic_load_n(&t.live, __ATOMIC_RELAXED))
		return;
	if (end < start)
		end = UINT64_MAX;
	pthread_mutex_lock(&t.lock);
	for (unsigned i = 0; i < GDR_DMABUF_RECS && t.live; i++) {
		struct rec *r = &t.r[i];

		if (r->ino && r->lo < end && start < r->hi) {
			forget(r);
			t.n.dropped++;
		}
	}
	pthread_mutex_unlock(&t.lock);
}

int gdr_dmabufs_lookup(int fd, uint64_t *va, uint64_t *size)
{
	const char *why;
	struct rec found = { 0 };
	struct stat st;
	uint64_t id = 0;
	unsigned slot = 0;

	if (gdr_events_probe(&why))
		return -ENOSYS;
	if (fstat(fd, &st))
		return -EBADF;
	pthread_mutex_lock(&t.lock);
	for (unsigned k = 1; k <= GDR_DMABUF_RECS && t.live; k++) {
		unsigned i = (t.next + GDR_DMABUF_RECS - k) % GDR_DMABUF_RECS;

		if (t.r[i].ino == (uint64_t)st.st_ino && t.r[i].dev == (uint64_t)st.st_dev) {
			found = t.r[i];
			slot = i;
			break;
		}
	}
	pthread_mutex_unlock(&t.lock);
	if (!found.ino)
		return -ENOENT;
	if (found.st_size == (uint64_t)st.st_size && now_ns() - found.t_ns <= gdr_dmabufs_ttl_ns &&
	    !gdr_cuda_buffer_id(found.va, &id) && id == found.buffer_id) {
		pthread_mutex_lock(&t.lock);
		t.n.vouched++;
		pthread_mutex_unlock(&t.lock);
		*va = found.va;
		*size = found.size;
		return 0;
	}
	pthread_mutex_lock(&t.lock);
	if (t.r[slot].ino && t.r[slot].gen == found.gen)
		forget(&t.r[slot]);
	t.n.stale++;
	pthread_mutex_unlock(&t.lock);
	return -ESTALE;
}

void gdr_dmabufs_counts(struct gdr_dmabufs_counts *c)
{
	pthread_mutex_lock(&t.lock);
	*c = t.n;
	c->live = t.live;
	pthread_mutex_unlock(&t.lock);
}
