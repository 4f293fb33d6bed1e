/* SPDX-License-Identifier: MIT */
/*
 * Issue 11 against the real CUDA driver (skips with 77 without a GPU), dmabuf backend, no PD (the
 * GPU machines have no NIC):
 *   pool    16 threads, each on its own stream, churn stream-ordered pool memory of mixed sizes
 *           (1 KiB .. 32 MiB, log-uniform) and register every allocation, holding some across
 *           others' frees: the share of registrations that succeed (target: >= 99 %), and every
 *           registration checked against the allocation the driver reports now (BUFFER_ID): 0
 *           stale. Once in mode events and once in mode tag.
 *   multi   (two GPUs) a thread per GPU registers and frees cuMemAlloc and pool memory; GPU 1's
 *           primary context is reset mid-run while GPU 0's thread keeps hitting its cached set:
 *           GPU 0's entries untouched (no new miss), GPU 1's dropped; a thread with no context
 *           registers GPU 1's memory, and the library keeps no reference on GPU 1's primary context
 *           (the application's last release makes it inactive).
 *   ipc     a second process (forked before cuInit) imports memory by a legacy IPC handle (the
 *           driver exports no dma-buf of it: refused with -EOPNOTSUPP) and by a VMM POSIX fd
 *           (registers; its BUFFER_ID is the importer's; cuMemUnmap drops it before it returns).
 * Prints TAP-like lines and the figures of docs/memory-kinds.md.
 * Usage: test_memkinds [pool|multi|ipc]... (default: all)
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "gdrcache.h"

static int failed, passed;

#define OK(cond, ...)                                                                          \
	do {                                                                                   \
		if (cond) {                                                                    \
			passed++;                                                              \
			printf("ok %d - ", passed + failed);                                   \
		} else {                                                                       \
			failed++;                                                              \
			printf("not ok %d - (%s:%d: %s) ", passed + failed, __FILE__, __LINE__, \
			       #cond);                                                         \
		}                                                                              \
		printf(__VA_ARGS__);                                                           \
		printf("\n");                                                                  \
	} while (0)

#define MiB (1024ULL * 1024)

static int ndev;
static CUcontext pctx[8];

static struct gdr_cache *make_cache(int mode)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE,
				    .backend = GDR_BACKEND_DMABUF, .validate = mode };
	struct gdr_cache *c = NULL;
	int rc = gdr_cache_create(&a, &c);

	if (rc)
		printf("# gdr_cache_create(validate %d): %d\n", mode, rc);
	return rc ? NULL : c;
}

static struct gdr_cache_stats stats(struct gdr_cache *c)
{
	struct gdr_cache_stats s;

	gdr_cache_get_stats(c, &s);
	return s;
}

static uint64_t buffer_id(CUdeviceptr p)
{
	unsigned long long id = 0;

	return cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) ? 0 : id;
}

/* Whether r maps [p, p+n) of the allocation the driver reports at p now. */
static bool region_current(struct gdr_region *r, CUdeviceptr p, size_t n)
{
	uint64_t id = 0, base = 0, len = 0;

	if (gdr_region_buffer_id(r, &id) || gdr_region_range(r, &base, &len))
		return false;
	return id == buffer_id(p) && id != 0 && base <= p && p + n <= base + len;
}

/* ---- pool ---------------------------------------------------------------------------------------- */

struct pool_arg {
	struct gdr_cache *c;
	int id, ops, dev;
	unsigned long regs, ok, refused, other_err, stale, held_max;
};

static size_t rand_size(unsigned *seed)
{
	int sh = 10 + rand_r(seed) % 16; /* 1 KiB .. 32 MiB, odd sizes */
	size_t s = (size_t)1 << sh;

	return s + (size_t)(rand_r(seed) % (unsigned)s);
}

/* Why a pool registration was refused: what the driver reports and exports now. */
static void explain(CUdeviceptr p, size_t size, CUdeviceptr a, size_t n)
{
	CUdeviceptr mb = 0, rs = 0;
	size_t ms = 0, rsz = 0;
	int fd = -1, dev = -1;
	CUresult rc;
	const char *e = "?";

	cuPointerGetAttribute(&mb, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, a);
	cuPointerGetAttribute(&ms, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, a);
	cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, a);
	cuPointerGetAttribute(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, a);
	cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, a);
	rc = cuMemGetHandleForAddressRange(&fd, mb, ms, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	cuGetErrorName(rc, &e);
	printf("# refused: allocation [%#llx,+%#zx) dev %d, asked [%#llx,+%#zx), RANGE [%#llx,+%#zx), "
	       "MAPPING [%#llx,+%#zx); the test's own export of that chunk now: %s\n",
	       (unsigned long long)p, size, dev, (unsigned long long)a, n, (unsigned long long)rs, rsz,
	       (unsigned long long)mb, ms, e);
	if (fd >= 0)
		close(fd);
	if (getenv("EXPLAIN_MORE")) {
		CUdeviceptr lo2 = a & ~(CUdeviceptr)0x1fffff, c0 = 0, c1 = 0, q;
		CUdeviceptr e2 = (p + size + 0x1fffff) & ~(CUdeviceptr)0x1fffff;
		size_t cs = 0;
		const char *r[6];
		CUresult x;

		x = cuMemGetHandleForAddressRange(&fd, lo2, 2 << 20, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
		cuGetErrorName(x, &r[0]);
		if (fd >= 0)
			close(fd), fd = -1;
		x = cuMemGetHandleForAddressRange(&fd, p & ~(CUdeviceptr)0x1fffff,
						  e2 - (p & ~(CUdeviceptr)0x1fffff),
						  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
		cuGetErrorName(x, &r[1]);
		if (fd >= 0)
			close(fd), fd = -1;
		for (q = p; q < p + size; q = c1 + cs) {
			cuPointerGetAttribute(&c1, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, q);
			cuPointerGetAttribute(&cs, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, q);
			if (!c0)
				c0 = c1;
			if (!cs)
				break;
		}
		x = cuMemGetHandleForAddressRange(&fd, c0, c1 + cs - c0, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
		cuGetErrorName(x, &r[2]);
		if (fd >= 0)
			close(fd), fd = -1;
		x = cuMemGetHandleForAddressRange(&fd, mb, lo2 > mb ? lo2 - mb : 2 << 20,
						  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
		cuGetErrorName(x, &r[3]);
		if (fd >= 0)
			close(fd), fd = -1;
		printf("#   2 MiB piece at the address: %s; 2 MiB cover of the allocation: %s; cover of "
		       "all its chunks [%#llx,%#llx): %s; chunk start up to the address's 2 MiB: %s\n",
		       r[0], r[1], (unsigned long long)c0, (unsigned long long)(c1 + cs), r[2], r[3]);
	}
}

static void *pool_thread(void *argp)
{
	struct pool_arg *a = argp;
	enum { W = 32 };
	CUdeviceptr live[W] = { 0 };
	size_t sz[W] = { 0 };
	struct gdr_region *held[W] = { 0 };
	unsigned seed = 777 + a->id;
	CUstream st;

	cuCtxSetCurrent(pctx[a->dev]);
	cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
	for (int i = 0; i < a->ops; i++) {
		int k = rand_r(&seed) % W;
		struct gdr_region *r = NULL;
		int rc;

		if (held[k]) { /* held across the allocation's life, released before its free */
			gdr_dereg(held[k]);
			held[k] = NULL;
		}
		if (live[k])
			cuMemFreeAsync(live[k], st);
		sz[k] = rand_size(&seed);
		if (cuMemAllocAsync(&live[k], sz[k], st) != CUDA_SUCCESS) {
			live[k] = 0;
			continue;
		}
		cuStreamSynchronize(st);
		/* register a random piece of it, or the whole */
		{
			size_t off = rand_r(&seed) % 2 ? 0 : (size_t)(rand_r(&seed) % sz[k]) & ~4095ul;
			size_t n = off < sz[k] ? sz[k] - off : sz[k];

			if (off >= sz[k])
				off = 0, n = sz[k];
			a->regs++;
			rc = gdr_reg(a->c, NULL, (void *)(uintptr_t)(live[k] + off), n, 0, &r);
			if (rc == 0) {
				a->ok++;
				if (!region_current(r, live[k] + off, n))
					a->stale++;
				if (rand_r(&seed) % 4 == 0)
					held[k] = r;
				else
					gdr_dereg(r);
			} else if (rc == -EOPNOTSUPP) {
				a->refused++;
				if (a->refused <= 3)
					explain(live[k], sz[k], live[k] + off, n);
			} else {
				a->other_err++;
			}
		}
		/* and now and then a second registration of a neighbour slot, a likely hit */
		{
			int j = rand_r(&seed) % W;

			if (live[j]) {
				a->regs++;
				rc = gdr_reg(a->c, NULL, (void *)(uintptr_t)live[j], 4096 < sz[j] ? 4096 : sz[j],
					     0, &r);
				if (rc == 0) {
					a->ok++;
					if (!region_current(r, live[j], 4096 < sz[j] ? 4096 : sz[j]))
						a->stale++;
					gdr_dereg(r);
				} else if (rc == -EOPNOTSUPP) {
					a->refused++;
					if (a->refused <= 3)
						explain(live[j], sz[j], live[j],
							4096 < sz[j] ? 4096 : sz[j]);
				} else {
					a->other_err++;
				}
			}
		}
	}
	for (int k = 0; k < W; k++) {
		if (held[k])
			gdr_dereg(held[k]);
		if (live[k])
			cuMemFreeAsync(live[k], st);
	}
	cuStreamSynchronize(st);
	cuStreamDestroy(st);
	return NULL;
}

static void pool_run(int mode, const char *name, int threads, int ops)
{
	struct gdr_cache *c = make_cache(mode);
	pthread_t th[32];
	struct pool_arg args[32];
	unsigned long regs = 0, ok = 0, refused = 0, other = 0, stale = 0;
	struct gdr_cache_stats s;

	if (!c) {
		OK(0, "pool (%s): cache created", name);
		return;
	}
	for (int i = 0; i < threads; i++) {
		args[i] = (struct pool_arg){ .c = c, .id = i, .ops = ops, .dev = i % ndev };
		pthread_create(&th[i], NULL, pool_thread, &args[i]);
	}
	for (int i = 0; i < threads; i++) {
		pthread_join(th[i], NULL);
		regs += args[i].regs, ok += args[i].ok, refused += args[i].refused;
		other += args[i].other_err, stale += args[i].stale;
	}
	s = stats(c);
	printf("# pool churn, mode %s, %d threads x %d allocations (1 KiB-32 MiB, %d GPU): %lu "
	       "registrations, %lu ok (%.2f %%), %lu refused, %lu other errors, %lu stale; cache: "
	       "%llu hits, %llu misses, %llu pins, %llu stale entries, %llu events, fail_pin %llu\n",
	       name, threads, ops, ndev, regs, ok, 100.0 * ok / (regs ? regs : 1), refused, other,
	       stale, (unsigned long long)s.hits, (unsigned long long)s.misses,
	       (unsigned long long)s.pins, (unsigned long long)s.stale,
	       (unsigned long long)s.events, (unsigned long long)s.fail_pin);
	OK(regs > 0 && ok * 100 >= regs * 99, "pool (%s): %.2f %% of %lu registrations succeed "
	   "(>= 99 %%)", name, 100.0 * ok / (regs ? regs : 1), regs);
	OK(stale == 0, "pool (%s): every registration maps the current allocation (%lu stale)", name,
	   stale);
	OK(gdr_cache_destroy(c) == 0, "pool (%s): cache destroyed", name);
}

static void test_pool_kind(void)
{
	struct gdr_cache *c = make_cache(GDR_VALIDATE_AUTO);
	CUdeviceptr p;
	struct gdr_region *r = NULL;
	enum gdr_mem_kind kind = GDR_MEM_HOST;
	uint64_t base = 0, len = 0;
	int rc;

	cuCtxSetCurrent(pctx[0]);
	cuMemAllocAsync(&p, 64 * 1024, 0);
	cuStreamSynchronize(0);
	rc = gdr_reg(c, NULL, (void *)(uintptr_t)p, 64 * 1024, 0, &r);
	OK(rc == 0, "a 64 KiB pool allocation registers (was -EOPNOTSUPP): %d", rc);
	if (!rc) {
		gdr_region_mem_kind(r, &kind);
		gdr_region_range(r, &base, &len);
		OK(kind == GDR_MEM_POOL, "its kind is GDR_MEM_POOL (%d)", kind);
		printf("# pinned range of a 64 KiB pool allocation: [%#llx, +%#llx) (the pool's "
		       "chunk)\n", (unsigned long long)base, (unsigned long long)len);
		gdr_dereg(r);
	}
	cuMemFreeAsync(p, 0);
	cuStreamSynchronize(0);
	gdr_cache_destroy(c);
}

/* ---- several GPUs -------------------------------------------------------------------------------- */

struct gpu_arg {
	struct gdr_cache *c;
	int dev;
	volatile int *stop;
	volatile int *phase; /* GPU 0's thread: 1 = only re-register the cached set */
	unsigned long regs, ok, stale;
};

static void *gpu_thread(void *argp)
{
	struct gpu_arg *a = argp;
	enum { N = 16 };
	CUdeviceptr m[N];
	unsigned seed = 99 + a->dev;

	cuCtxSetCurrent(pctx[a->dev]);
	for (int i = 0; i < N; i++) {
		if (i % 2)
			cuMemAllocAsync(&m[i], (1 + i) * 256 * 1024, 0);
		else
			cuMemAlloc(&m[i], (1 + i) * 256 * 1024);
	}
	cuStreamSynchronize(0);
	while (!*a->stop) {
		int k = rand_r(&seed) % N;
		struct gdr_region *r = NULL;

		if (*a->phase == 0 && rand_r(&seed) % 8 == 0) { /* churn: free and reallocate */
			if (k % 2) {
				cuMemFreeAsync(m[k], 0);
				cuMemAllocAsync(&m[k], (1 + k) * 256 * 1024, 0);
				cuStreamSynchronize(0);
			} else {
				cuMemFree(m[k]);
				cuMemAlloc(&m[k], (1 + k) * 256 * 1024);
			}
		}
		a->regs++;
		if (gdr_reg(a->c, NULL, (void *)(uintptr_t)m[k], 4096, 0, &r) == 0) {
			a->ok++;
			if (!region_current(r, m[k], 4096))
				a->stale++;
			gdr_dereg(r);
		}
	}
	for (int i = 0; i < N; i++) {
		if (i % 2)
			cuMemFreeAsync(m[i], 0);
		else
			cuMemFree(m[i]);
	}
	cuStreamSynchronize(0);
	return NULL;
}

struct noctx_arg {
	struct gdr_cache *c;
	CUdeviceptr p;
	int rc;
	bool current;
};

static void *reg_noctx(void *argp)
{
	struct noctx_arg *a = argp;
	struct gdr_region *r = NULL;

	a->rc = gdr_reg(a->c, NULL, (void *)(uintptr_t)a->p, 4096, 0, &r);
	if (!a->rc) {
		a->current = region_current(r, a->p, 4096);
		gdr_dereg(r);
	}
	return NULL;
}

static void test_multi(void)
{
	struct gdr_cache *c = make_cache(GDR_VALIDATE_AUTO);
	volatile int stop = 0, phase0 = 0, phase1 = 0;
	struct gpu_arg a0 = { .c = c, .dev = 0, .stop = &stop, .phase = &phase0 };
	struct gpu_arg a1 = { .c = c, .dev = 1, .stop = &stop, .phase = &phase1 };
	pthread_t t0, t1, tn;
	struct gdr_cache_stats s0, s1;
	CUdevice d1;
	CUdeviceptr m1;
	unsigned int flags;
	int active = -1;
	volatile int stop1 = 0;
	struct noctx_arg na;

	if (ndev < 2) {
		printf("# multi: %d GPU: skipped\n", ndev);
		gdr_cache_destroy(c);
		return;
	}
	cuDeviceGet(&d1, 1);
	pthread_create(&t0, NULL, gpu_thread, &a0);
	a1.stop = &stop1;
	pthread_create(&t1, NULL, gpu_thread, &a1);
	sleep(3);
	stop1 = 1; /* GPU 1's thread stops using its context; GPU 0's goes on */
	pthread_join(t1, NULL);
	/* GPU 1's thread freed its buffers: a cached set on GPU 1 for the reset to drop */
	{
		CUdeviceptr k[4];
		struct gdr_region *r;

		cuCtxSetCurrent(pctx[1]);
		for (int i = 0; i < 4; i++) {
			cuMemAlloc(&k[i], 1 * MiB);
			gdr_reg(c, NULL, (void *)(uintptr_t)k[i], 4096, 0, &r);
			gdr_dereg(r);
		}
		cuCtxSetCurrent(pctx[0]);
	}
	phase0 = 1; /* GPU 0: no more churn, only hits on its cached set */
	sleep(1);
	s0 = stats(c);
	cuDevicePrimaryCtxReset(d1); /* mid-run, while GPU 0's thread hits */
	sleep(1);
	s1 = stats(c);
	stop = 1;
	pthread_join(t0, NULL);
	printf("# multi: GPU 0 thread %lu registrations (%lu ok, %lu stale), GPU 1 thread %lu "
	       "(%lu ok, %lu stale); across the reset of GPU 1: %llu hits, %llu misses, %llu stale "
	       "entries dropped\n", a0.regs, a0.ok, a0.stale, a1.regs, a1.ok, a1.stale,
	       (unsigned long long)(s1.hits - s0.hits), (unsigned long long)(s1.misses - s0.misses),
	       (unsigned long long)(s1.stale - s0.stale));
	OK(a0.stale == 0 && a1.stale == 0, "multi: 0 stale registrations on either GPU");
	OK(a0.ok == a0.regs && a1.ok == a1.regs, "multi: every registration succeeded");
	OK(s1.hits > s0.hits && s1.misses == s0.misses,
	   "multi: GPU 0's entries untouched by GPU 1's reset (%llu hits, %llu misses)",
	   (unsigned long long)(s1.hits - s0.hits), (unsigned long long)(s1.misses - s0.misses));
	OK(s1.stale >= s0.stale + 4 || s1.entries + 4 <= s0.entries,
	   "multi: GPU 1's cached entries dropped by its reset (stale +%llu, entries %llu -> %llu)",
	   (unsigned long long)(s1.stale - s0.stale), (unsigned long long)s0.entries,
	   (unsigned long long)s1.entries);

	/* a thread with no context registers GPU 1's memory; then the application's last release */
	cuDevicePrimaryCtxRetain(&pctx[1], d1);
	cuCtxSetCurrent(pctx[1]);
	cuMemAlloc(&m1, 1 * MiB);
	cuCtxSetCurrent(pctx[0]);
	na = (struct noctx_arg){ .c = c, .p = m1 };
	pthread_create(&tn, NULL, reg_noctx, &na);
	pthread_join(tn, NULL);
	OK(na.rc == 0 && na.current, "multi: a thread with no context registers GPU 1's memory (%d)",
	   na.rc);
	gdr_cache_flush(c);
	cuDevicePrimaryCtxRelease(d1); /* the test's (and the application's) only reference */
	cuDevicePrimaryCtxRelease(d1); /* main()'s */
	cuDevicePrimaryCtxGetState(d1, &flags, &active);
	OK(active == 0, "multi: the library keeps no reference on GPU 1's primary context (active %d "
	   "after the application's last release)", active);
	cuDevicePrimaryCtxRetain(&pctx[1], d1);
	OK(gdr_cache_destroy(c) == 0, "multi: cache destroyed");
}

/* ---- memory from another process -------------------------------------------------------------- */

struct ipc_msg {
	CUipcMemHandle h;
	size_t vmm_size;
};

static int send_msg(int sock, int fd, const struct ipc_msg *m)
{
	char cbuf[CMSG_SPACE(sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = (void *)m, .iov_len = sizeof(*m) };
	struct msghdr h = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&h);

	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(sock, &h, 0) == (ssize_t)sizeof(*m) ? 0 : -1;
}

static int recv_msg(int sock, int *fd, struct ipc_msg *m)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
	struct msghdr h = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;

	if (recvmsg(sock, &h, MSG_WAITALL) != (ssize_t)sizeof(*m))
		return -1;
	cm = CMSG_FIRSTHDR(&h);
	*fd = cm && cm->cmsg_type == SCM_RIGHTS ? *(int *)CMSG_DATA(cm) : -1;
	return 0;
}

/* The importer: its own TAP counters, reported through its exit status. */
static int ipc_importer(int sock)
{
	struct ipc_msg m;
	int fd = -1, rc;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p, va;
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc acc = { 0 };
	struct gdr_cache *c;
	struct gdr_region *r = NULL;
	struct gdr_cache_stats s;

	if (recv_msg(sock, &fd, &m))
		return 2;
	cuInit(0);
	cuDeviceGet(&dev, 0);
	cuDevicePrimaryCtxRetain(&ctx, dev);
	cuCtxSetCurrent(ctx);
	c = make_cache(GDR_VALIDATE_AUTO);
	if (!c)
		return 2;
	OK(cuIpcOpenMemHandle(&p, m.h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) == CUDA_SUCCESS,
	   "ipc: legacy handle opened in the second process");
	rc = gdr_reg(c, NULL, (void *)(uintptr_t)p, 4096, 0, &r);
	s = stats(c);
	OK(rc == -EOPNOTSUPP && s.fail_pin == 1,
	   "ipc: legacy-IPC memory (no dma-buf from the driver) refused with -EOPNOTSUPP, counted "
	   "(rc %d, fail_pin %llu)", rc, (unsigned long long)s.fail_pin);
	if (!rc)
		gdr_dereg(r);
	cuIpcCloseMemHandle(p);

	OK(cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
					  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == CUDA_SUCCESS,
	   "ipc: VMM POSIX fd imported");
	cuMemAddressReserve(&va, m.vmm_size, 0, 0, 0);
	cuMemMap(va, m.vmm_size, 0, h, 0);
	acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	acc.location.id = 0;
	acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	cuMemSetAccess(va, m.vmm_size, &acc, 1);
	rc = gdr_reg(c, NULL, (void *)(uintptr_t)va, m.vmm_size, 0, &r);
	OK(rc == 0 && region_current(r, va, m.vmm_size),
	   "ipc: imported VMM memory registers, tagged with the importer's BUFFER_ID (%d)", rc);
	if (!rc) {
		enum gdr_mem_kind kind = GDR_MEM_HOST;

		gdr_region_mem_kind(r, &kind);
		OK(kind == GDR_MEM_VMM, "ipc: imported VMM memory is VMM memory (%d)", kind);
		gdr_dereg(r);
	}
	s = stats(c);
	cuMemUnmap(va, m.vmm_size);
	{
		struct gdr_cache_stats s2 = stats(c);

		OK(s2.validate_mode != GDR_VALIDATE_EVENTS || s2.entries + 1 == s.entries,
		   "ipc: cuMemUnmap of the import drops its entry before it returns (mode %llu, "
		   "entries %llu -> %llu)", (unsigned long long)s2.validate_mode,
		   (unsigned long long)s.entries, (unsigned long long)s2.entries);
	}
	cuMemMap(va, m.vmm_size, 0, h, 0);
	cuMemSetAccess(va, m.vmm_size, &acc, 1);
	rc = gdr_reg(c, NULL, (void *)(uintptr_t)va, m.vmm_size, 0, &r);
	OK(rc == 0 && region_current(r, va, m.vmm_size),
	   "ipc: re-mapped import registers anew with its new BUFFER_ID (%d)", rc);
	if (!rc)
		gdr_dereg(r);
	cuMemUnmap(va, m.vmm_size);
	cuMemRelease(h);
	cuMemAddressFree(va, m.vmm_size);
	gdr_cache_destroy(c);
	return failed ? 1 : 0;
}

static void test_ipc(int sock, pid_t child)
{
	struct ipc_msg m = { 0 };
	CUdeviceptr p;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop = { 0 };
	size_t gran = 0;
	int fd = -1, status = 0;

	cuCtxSetCurrent(pctx[0]);
	cuMemAlloc(&p, 4 * MiB);
	cuIpcGetMemHandle(&m.h, p);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
	m.vmm_size = 2 * gran;
	cuMemCreate(&h, m.vmm_size, &prop, 0);
	cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
	fflush(stdout);
	send_msg(sock, fd, &m);
	waitpid(child, &status, 0);
	OK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "ipc: the importer's checks passed (%d)",
	   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	cuMemRelease(h);
	cuMemFree(p);
}

int main(int argc, char **argv)
{
	bool want[3] = { argc < 2, argc < 2, argc < 2 };
	int sv[2] = { -1, -1 };
	pid_t child = -1;

	for (int i = 1; i < argc; i++) {
		want[0] |= !strcmp(argv[i], "pool");
		want[1] |= !strcmp(argv[i], "multi");
		want[2] |= !strcmp(argv[i], "ipc");
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (want[2]) {
		socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
		child = fork();
		if (child == 0) {
			close(sv[0]);
			_exit(ipc_importer(sv[1]));
		}
		close(sv[1]);
	}
	if (cuInit(0) || cuDeviceGetCount(&ndev) || !ndev) {
		printf("# no GPU: skipped\n");
		if (child > 0)
			kill(child, 9);
		return 77;
	}
	if (ndev > 8)
		ndev = 8;
	for (int i = 0; i < ndev; i++) {
		CUdevice d;

		cuDeviceGet(&d, i);
		cuDevicePrimaryCtxRetain(&pctx[i], d);
	}
	cuCtxSetCurrent(pctx[0]);
	if (want[2])
		test_ipc(sv[0], child);
	if (want[0]) {
		test_pool_kind();
		pool_run(GDR_VALIDATE_EVENTS, "events", 16, 400);
		pool_run(GDR_VALIDATE_TAG, "tag", 16, 400);
	}
	if (want[1])
		test_multi();
	printf("# %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
