/* SPDX-License-Identifier: MIT */
/*
 * Probe (not a test): what the CUDA driver reports and exports for the memory issue 11 is about,
 * printed as facts for docs/FACTS.md ("Pool memory", "Several GPUs", "Memory from another
 * process"; exits 77 without a GPU):
 *   pool    stream-ordered pool allocations of mixed sizes, churned by 16 threads: their RANGE and
 *           MAPPING attributes, and which dma-buf export succeeds: the exact 64 KiB cover, the cover
 *           of the physical chunks (MAPPING ranges) the allocation spans, or each chunk alone;
 *           what an open dma-buf of a chunk does to the pool's trim and to VA reuse
 *   multi   two GPUs: exporting one GPU's memory with the other's context current or none; what a
 *           primary-context release (not the last, then the last) and a reset of one GPU do to
 *           both GPUs' memory
 *   ipc     a second process (forked before cuInit) imports memory by a legacy IPC handle and by a
 *           VMM POSIX fd: attributes, BUFFER_ID, SYNC_MEMOPS, dma-buf export, close/unmap, reopen
 * Build on the GPU machine: gcc -O2 -I$CUDA_HOME/include mem_probe.c -lcuda -lpthread
 * Usage: mem_probe [pool|multi|ipc]... (default: all)
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                      \
	do {                                                                                       \
		CUresult r_ = (x);                                                                 \
		if (r_ != CUDA_SUCCESS) {                                                          \
			const char *s_ = "?";                                                      \
			cuGetErrorName(r_, &s_);                                                   \
			printf("  %s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_);                  \
		}                                                                                  \
	} while (0)

static const char *ename(CUresult r)
{
	const char *s = "?";

	cuGetErrorName(r, &s);
	return s;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int try_export(CUdeviceptr p, size_t len, double *us)
{
	int fd = -1;
	double t0 = now_us();
	CUresult rc = cuMemGetHandleForAddressRange(&fd, p, len, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);

	if (us)
		*us += now_us() - t0;
	if (fd >= 0)
		close(fd);
	return rc;
}

static void mapping(CUdeviceptr p, CUdeviceptr *base, size_t *size)
{
	*base = 0;
	*size = 0;
	cuPointerGetAttribute(base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, p);
	cuPointerGetAttribute(size, CU_POINTER_ATTRIBUTE_MAPPING_SIZE, p);
}

static unsigned long long buffer_id(CUdeviceptr p, CUresult *rc)
{
	unsigned long long id = 0;
	CUresult r = cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p);

	if (rc)
		*rc = r;
	return id;
}

static void describe(const char *what, CUdeviceptr p, size_t size)
{
	CUdeviceptr rs = 0, mb = 0, mbe = 0;
	size_t rsz = 0, ms = 0, mse = 0;
	unsigned mt = 0;
	int dev = -1, gdr = -1;
	CUcontext ctx = 0;
	CUresult rc;
	unsigned long long id = buffer_id(p, &rc);

	cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
	cuPointerGetAttribute(&rs, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p);
	cuPointerGetAttribute(&rsz, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p);
	cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
	cuPointerGetAttribute(&ctx, CU_POINTER_ATTRIBUTE_CONTEXT, p);
	cuPointerGetAttribute(&gdr, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, p);
	mapping(p, &mb, &ms);
	mapping(p + size - 1, &mbe, &mse);
	printf("  %s: ptr %#llx size %#zx | BUFFER_ID %llu (%s) type %u dev %d ctx %p gdr %d | RANGE "
	       "[%#llx,+%#zx) | MAPPING@start [%#llx,+%#zx) @end [%#llx,+%#zx)\n",
	       what, (unsigned long long)p, size, id, ename(rc), mt, dev, (void *)ctx, gdr,
	       (unsigned long long)rs, rsz, (unsigned long long)mb, ms, (unsigned long long)mbe, mse);
}

/* ---- pool -------------------------------------------------------------------------------------- */

enum { S_EXACT, S_CHUNKS, S_EACH, S_NONE, S_N };
static const char *s_names[S_N] = { "exact 64 KiB cover", "cover of its chunks", "each chunk alone",
				    "nothing" };

struct pool_stats {
	unsigned long n, by[S_N], multi_chunk, chunk_hist[8];
	double us_exact, us_chunks;
	unsigned long n_exact_try, n_chunks_try;
	unsigned long id_changed_same_va;
};

static pthread_mutex_t plock = PTHREAD_MUTEX_INITIALIZER;
static struct pool_stats ptot;
static int g_dev_count;
static CUcontext g_ctx[8];

static int classify_export(CUdeviceptr p, size_t size, struct pool_stats *s)
{
	CUdeviceptr lo = p & ~(CUdeviceptr)0xffff, hi = (p + size + 0xffff) & ~(CUdeviceptr)0xffff;
	CUdeviceptr cb, q = p, first = 0, last = 0;
	size_t cs;
	int nchunks = 0, each_ok = 1;

	s->n_exact_try++;
	if (try_export(lo, hi - lo, &s->us_exact) == CUDA_SUCCESS)
		return S_EXACT;
	while (q < p + size) {
		mapping(q, &cb, &cs);
		if (!cs)
			return S_NONE;
		if (!nchunks)
			first = cb;
		last = cb + cs;
		nchunks++;
		for (int b = 0; b < 8; b++)
			if (cs <= (2ull << 20) << (2 * b) || b == 7) {
				s->chunk_hist[b]++;
				break;
			}
		q = cb + cs;
	}
	if (nchunks > 1)
		s->multi_chunk++;
	s->n_chunks_try++;
	if (try_export(first, last - first, &s->us_chunks) == CUDA_SUCCESS)
		return S_CHUNKS;
	for (q = p; q < p + size; q = cb + cs) {
		mapping(q, &cb, &cs);
		if (try_export(cb, cs, NULL) != CUDA_SUCCESS)
			each_ok = 0;
	}
	return each_ok ? S_EACH : S_NONE;
}

struct pool_arg {
	int id, ops, window;
	int dev;
	CUmemoryPool pool; /* 0: the default pool */
};

static size_t rand_size(unsigned *seed)
{
	/* log-uniform 1 KiB .. 32 MiB, with odd sizes */
	int sh = 10 + rand_r(seed) % 16;
	size_t s = (size_t)1 << sh;

	return s + (size_t)(rand_r(seed) % (unsigned)s);
}

static void *pool_thread(void *argp)
{
	struct pool_arg *a = argp;
	struct pool_stats s = { 0 };
	CUdeviceptr live[256] = { 0 };
	size_t lsz[256] = { 0 };
	unsigned long long lid[256] = { 0 };
	unsigned seed = 1234 + a->id;
	CUstream st;

	cuCtxSetCurrent(g_ctx[a->dev]);
	CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	for (int i = 0; i < a->ops; i++) {
		int k = rand_r(&seed) % a->window;
		CUdeviceptr old = live[k];
		unsigned long long oldid = lid[k];
		CUresult rc;

		if (live[k]) {
			CK(cuMemFreeAsync(live[k], st));
			live[k] = 0;
		}
		lsz[k] = rand_size(&seed);
		rc = a->pool ? cuMemAllocFromPoolAsync(&live[k], lsz[k], a->pool, st)
			     : cuMemAllocAsync(&live[k], lsz[k], st);
		if (rc != CUDA_SUCCESS) {
			printf("  alloc %zu: %s\n", lsz[k], ename(rc));
			live[k] = 0;
			continue;
		}
		CK(cuStreamSynchronize(st));
		lid[k] = buffer_id(live[k], NULL);
		if (live[k] == old && lid[k] == oldid)
			s.id_changed_same_va++; /* counts the violations: same VA, same id */
		s.by[classify_export(live[k], lsz[k], &s)]++;
		s.n++;
	}
	for (int k = 0; k < a->window; k++)
		if (live[k])
			cuMemFreeAsync(live[k], st);
	cuStreamSynchronize(st);
	cuStreamDestroy(st);
	pthread_mutex_lock(&plock);
	ptot.n += s.n;
	for (int i = 0; i < S_N; i++)
		ptot.by[i] += s.by[i];
	for (int i = 0; i < 8; i++)
		ptot.chunk_hist[i] += s.chunk_hist[i];
	ptot.multi_chunk += s.multi_chunk;
	ptot.us_exact += s.us_exact;
	ptot.us_chunks += s.us_chunks;
	ptot.n_exact_try += s.n_exact_try;
	ptot.n_chunks_try += s.n_chunks_try;
	ptot.id_changed_same_va += s.id_changed_same_va;
	pthread_mutex_unlock(&plock);
	return NULL;
}

static void pool_churn(const char *what, int threads, int ops, int window, CUmemoryPool pool)
{
	pthread_t th[32];
	struct pool_arg args[32];
	double t0 = now_us();

	memset(&ptot, 0, sizeof(ptot));
	for (int i = 0; i < threads; i++) {
		args[i] = (struct pool_arg){ .id = i, .ops = ops, .window = window, .dev = 0, .pool = pool };
		pthread_create(&th[i], NULL, pool_thread, &args[i]);
	}
	for (int i = 0; i < threads; i++)
		pthread_join(th[i], NULL);
	printf("pool churn (%s): %d threads x %d allocations (1 KiB-64 MiB log-uniform, %d live per "
	       "thread), %.1f s\n", what, threads, ops, window, (now_us() - t0) / 1e6);
	for (int i = 0; i < S_N; i++)
		printf("  exported as %-22s %6lu (%.2f %%)\n", s_names[i], ptot.by[i],
		       100.0 * ptot.by[i] / (ptot.n ? ptot.n : 1));
	printf("  allocations spanning >1 chunk: %lu; chunk sizes <=2M %lu <=8M %lu <=32M %lu "
	       "<=128M %lu <=512M %lu larger %lu\n", ptot.multi_chunk, ptot.chunk_hist[0],
	       ptot.chunk_hist[1], ptot.chunk_hist[2], ptot.chunk_hist[3], ptot.chunk_hist[4],
	       ptot.chunk_hist[5] + ptot.chunk_hist[6] + ptot.chunk_hist[7]);
	printf("  mean export time: exact cover %.1f us (%lu tries), chunk cover %.1f us (%lu tries); "
	       "same VA with same BUFFER_ID after free+alloc: %lu\n",
	       ptot.us_exact / (ptot.n_exact_try ? ptot.n_exact_try : 1), ptot.n_exact_try,
	       ptot.us_chunks / (ptot.n_chunks_try ? ptot.n_chunks_try : 1), ptot.n_chunks_try,
	       ptot.id_changed_same_va);
}

static void pool_hostage(void)
{
	CUdeviceptr a, b, cb;
	size_t cs, fr0, fr1, fr2, fr3, tot;
	CUmemoryPool pool;
	CUdevice dev;
	int fd = -1;
	CUresult rc;
	unsigned long long ida, idb;

	printf("pool: an open dma-buf of a chunk, the allocation freed and the pool trimmed\n");
	cuCtxGetDevice(&dev);
	cuDeviceGetDefaultMemPool(&pool, dev);
	CK(cuMemPoolTrimTo(pool, 0));
	cuMemGetInfo(&fr0, &tot);
	CK(cuMemAllocAsync(&a, 256 << 20, 0));
	CK(cuStreamSynchronize(0));
	ida = buffer_id(a, NULL);
	describe("A 256 MiB", a, 256 << 20);
	mapping(a, &cb, &cs);
	rc = cuMemGetHandleForAddressRange(&fd, cb, cs, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("  export chunk [%#llx,+%#zx): %s\n", (unsigned long long)cb, cs, ename(rc));
	cuMemGetInfo(&fr1, &tot);
	CK(cuMemFreeAsync(a, 0));
	CK(cuStreamSynchronize(0));
	CK(cuMemPoolTrimTo(pool, 0));
	cuMemGetInfo(&fr2, &tot);
	printf("  free memory: before %zu MiB, allocated %zu MiB, freed+trimmed with dma-buf open %zu "
	       "MiB\n", fr0 >> 20, fr1 >> 20, fr2 >> 20);
	{
		CUresult r2;
		unsigned long long id2 = buffer_id(a, &r2);

		printf("  after free+trim: BUFFER_ID query at A -> %s (%llu)\n", ename(r2), id2);
	}
	CK(cuMemAllocAsync(&b, 256 << 20, 0));
	CK(cuStreamSynchronize(0));
	idb = buffer_id(b, NULL);
	printf("  re-allocated 256 MiB: %s VA, BUFFER_ID %s\n", b == a ? "same" : "other",
	       idb == ida ? "same" : "new");
	describe("B", b, 256 << 20);
	if (fd >= 0)
		close(fd);
	CK(cuMemFreeAsync(b, 0));
	CK(cuStreamSynchronize(0));
	CK(cuMemPoolTrimTo(pool, 0));
	cuMemGetInfo(&fr3, &tot);
	printf("  dma-buf closed, B freed, trimmed: free %zu MiB\n", fr3 >> 20);

	/* small allocations sharing a chunk: ids, and whether one chunk export covers the others */
	{
		CUdeviceptr s[4];

		for (int i = 0; i < 4; i++)
			CK(cuMemAllocAsync(&s[i], 64 << 10, 0));
		CK(cuStreamSynchronize(0));
		for (int i = 0; i < 4; i++)
			describe("small 64 KiB", s[i], 64 << 10);
		mapping(s[0], &cb, &cs);
		rc = cuMemGetHandleForAddressRange(&fd, cb, cs, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
		printf("  chunk of small[0] export: %s\n", ename(rc));
		if (rc == CUDA_SUCCESS)
			close(fd);
		for (int i = 0; i < 4; i++)
			cuMemFreeAsync(s[i], 0);
		CK(cuStreamSynchronize(0));
	}
}

/* Export a chunk again while a dma-buf of it is open: the same allocation, and after the chunk's
 * only allocation was freed, the pool trimmed and a new allocation took the same VA. */
static void pool_reexport(void)
{
	CUdeviceptr a, b, cb, cb2;
	size_t cs, cs2;
	int fd1 = -1, fd2 = -1;
	CUresult rc;
	CUmemoryPool pool;
	CUdevice dev;

	printf("pool: exporting a chunk again while a dma-buf of it is open\n");
	cuCtxGetDevice(&dev);
	cuDeviceGetDefaultMemPool(&pool, dev);
	CK(cuMemPoolTrimTo(pool, 0));
	CK(cuMemAllocAsync(&a, 64 << 10, 0));
	CK(cuStreamSynchronize(0));
	mapping(a, &cb, &cs);
	rc = cuMemGetHandleForAddressRange(&fd1, cb, cs, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("  first export [%#llx,+%#zx): %s\n", (unsigned long long)cb, cs, ename(rc));
	rc = cuMemGetHandleForAddressRange(&fd2, cb, cs, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("  second export, first open, allocation live: %s\n", ename(rc));
	if (fd2 >= 0)
		close(fd2), fd2 = -1;
	CK(cuMemFreeAsync(a, 0));
	CK(cuStreamSynchronize(0));
	CK(cuMemPoolTrimTo(pool, 0));
	CK(cuMemAllocAsync(&b, 64 << 10, 0));
	CK(cuStreamSynchronize(0));
	mapping(b, &cb2, &cs2);
	printf("  new allocation %s VA, chunk [%#llx,+%#zx)\n", a == b ? "same" : "other",
	       (unsigned long long)cb2, cs2);
	rc = cuMemGetHandleForAddressRange(&fd2, cb2, cs2, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("  export of the new chunk while the old chunk's dma-buf is open: %s\n", ename(rc));
	if (fd2 >= 0)
		close(fd2), fd2 = -1;
	close(fd1);
	rc = cuMemGetHandleForAddressRange(&fd2, cb2, cs2, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("  ... and once it is closed: %s\n", ename(rc));
	if (fd2 >= 0)
		close(fd2);
	/* without a trim, the freed allocation's chunk kept: same VA again */
	rc = cuMemGetHandleForAddressRange(&fd1, cb2, cs2, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	CK(cuMemFreeAsync(b, 0));
	CK(cuStreamSynchronize(0));
	CK(cuMemAllocAsync(&a, 64 << 10, 0));
	CK(cuStreamSynchronize(0));
	mapping(a, &cb, &cs);
	rc = cuMemGetHandleForAddressRange(&fd2, cb, cs, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	printf("  free+alloc without trim (%s VA), old dma-buf open: export %s\n",
	       a == b ? "same" : "other", ename(rc));
	if (fd2 >= 0)
		close(fd2);
	if (fd1 >= 0)
		close(fd1);
	CK(cuMemFreeAsync(a, 0));
	CK(cuStreamSynchronize(0));
}

static void pool_probe(void)
{
	CUmemoryPool pool;
	CUdevice dev;
	uint64_t thr = UINT64_MAX;
	CUmemPoolProps props;

	cuCtxSetCurrent(g_ctx[0]);
	pool_reexport();
	if (getenv("PROBE_REEXPORT_ONLY"))
		return;
	pool_hostage();
	pool_churn("default pool, release threshold 0", 16, 400, 32, 0);
	cuCtxGetDevice(&dev);
	cuDeviceGetDefaultMemPool(&pool, dev);
	CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	pool_churn("default pool, release threshold max (as PyTorch's cudaMallocAsync)", 16, 400, 32, 0);
	thr = 0;
	CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	memset(&props, 0, sizeof(props));
	props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
	props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	props.location.id = 0;
	props.handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	if (cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS) {
		pool_churn("explicit pool, POSIX fd handle type", 16, 400, 32, pool);
		cuMemPoolDestroy(pool);
	}
}

/* ---- several GPUs ------------------------------------------------------------------------------ */

static void *export_no_ctx(void *arg)
{
	CUdeviceptr p = *(CUdeviceptr *)arg;

	printf("  export GPU1 memory, thread without context: %s\n", ename(try_export(p, 1 << 20, NULL)));
	cuCtxSetCurrent(g_ctx[0]);
	printf("  export GPU1 memory, thread with GPU0's primary context: %s\n",
	       ename(try_export(p, 1 << 20, NULL)));
	cuCtxSetCurrent(g_ctx[1]);
	printf("  export GPU1 memory, thread with GPU1's primary context: %s\n",
	       ename(try_export(p, 1 << 20, NULL)));
	return NULL;
}

static void multi_probe(void)
{
	CUdeviceptr m0, m1, p1;
	CUdevice d1;
	CUcontext c;
	CUresult rc;
	pthread_t th;
	unsigned int flags;
	int active;

	if (g_dev_count < 2) {
		printf("multi: %d GPU: skipped\n", g_dev_count);
		return;
	}
	printf("multi: two GPUs\n");
	cuCtxSetCurrent(g_ctx[0]);
	CK(cuMemAlloc(&m0, 1 << 20));
	cuCtxSetCurrent(g_ctx[1]);
	CK(cuMemAlloc(&m1, 1 << 20));
	CK(cuMemAllocAsync(&p1, 1 << 20, 0));
	CK(cuStreamSynchronize(0));
	describe("GPU0 cuMemAlloc", m0, 1 << 20);
	describe("GPU1 cuMemAlloc", m1, 1 << 20);
	describe("GPU1 pool", p1, 1 << 20);
	pthread_create(&th, NULL, export_no_ctx, &m1);
	pthread_join(th, NULL);
	cuDeviceGet(&d1, 1);
	CK(cuDevicePrimaryCtxRetain(&c, d1)); /* a second reference */
	CK(cuDevicePrimaryCtxRelease(d1));
	printf("  GPU1 primary release (not the last): m1 BUFFER_ID -> ");
	buffer_id(m1, &rc);
	printf("%s\n", ename(rc));
	cuCtxSetCurrent(g_ctx[0]);
	CK(cuDevicePrimaryCtxRelease(d1)); /* main's retain: the last */
	cuDevicePrimaryCtxGetState(d1, &flags, &active);
	printf("  GPU1 primary release (the last): active %d; m1 BUFFER_ID -> ", active);
	buffer_id(m1, &rc);
	printf("%s; pool p1 -> ", ename(rc));
	buffer_id(p1, &rc);
	printf("%s; GPU0 m0 -> ", ename(rc));
	buffer_id(m0, &rc);
	printf("%s\n", ename(rc));
	CK(cuDevicePrimaryCtxRetain(&g_ctx[1], d1));
	cuCtxSetCurrent(g_ctx[1]);
	CK(cuMemAlloc(&m1, 1 << 20));
	describe("GPU1 after re-retain", m1, 1 << 20);
	{
		CUdevice d0;

		cuDeviceGet(&d0, 0);
		CK(cuDevicePrimaryCtxReset(d1));
		printf("  GPU1 primary reset: m1 -> ");
		buffer_id(m1, &rc);
		printf("%s; GPU0 m0 -> ", ename(rc));
		buffer_id(m0, &rc);
		printf("%s\n", ename(rc));
		(void)d0;
	}
	CK(cuDevicePrimaryCtxRetain(&g_ctx[1], d1));
	cuCtxSetCurrent(g_ctx[0]);
	{
		/* a cuCtxCreate'd context on GPU0: its memory, exported with the primary current */
		CUcontext own;
		CUdeviceptr q;
		CUdevice d0;

		cuDeviceGet(&d0, 0);
		CK(cuCtxCreate(&own, NULL, 0, d0));
		CK(cuMemAlloc(&q, 1 << 20));
		describe("GPU0 non-primary ctx", q, 1 << 20);
		cuCtxSetCurrent(g_ctx[0]);
		printf("  export non-primary ctx memory with GPU0's primary current: %s\n",
		       ename(try_export(q, 1 << 20, NULL)));
		CK(cuCtxDestroy(own));
		cuCtxSetCurrent(g_ctx[0]);
		printf("  after cuCtxDestroy: its memory -> ");
		buffer_id(q, &rc);
		printf("%s; m0 -> ", ename(rc));
		buffer_id(m0, &rc);
		printf("%s\n", ename(rc));
	}
}

/* ---- memory from another process ---------------------------------------------------------------- */

static int send_fd(int sock, int fd, const void *buf, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };

	if (fd >= 0) {
		struct cmsghdr *cm;

		memset(cbuf, 0, sizeof(cbuf));
		m.msg_control = cbuf;
		m.msg_controllen = sizeof(cbuf);
		cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	return sendmsg(sock, &m, 0) == (ssize_t)len ? 0 : -1;
}

static int recv_fd(int sock, int *fd, void *buf, size_t len)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = buf, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;

	if (recvmsg(sock, &m, MSG_WAITALL) != (ssize_t)len)
		return -1;
	cm = CMSG_FIRSTHDR(&m);
	if (fd)
		*fd = cm && cm->cmsg_type == SCM_RIGHTS ? *(int *)CMSG_DATA(cm) : -1;
	return 0;
}

struct ipc_msg {
	CUipcMemHandle h;
	unsigned long long legacy_id, vmm_id;
	size_t vmm_size;
};

static void ipc_child(int sock)
{
	struct ipc_msg msg;
	CUdevice dev;
	CUcontext ctx;
	CUdeviceptr p, p2, va;
	CUmemGenericAllocationHandle h;
	CUmemAccessDesc acc = { 0 };
	int fd = -1;
	unsigned one = 1;
	CUresult rc;
	char ok = 1;

	recv_fd(sock, &fd, &msg, sizeof(msg));
	CK(cuInit(0));
	cuDeviceGet(&dev, 0);
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	cuCtxSetCurrent(ctx);
	printf("ipc (second process): legacy handle, exporter's BUFFER_ID %llu\n", msg.legacy_id);
	rc = cuIpcOpenMemHandle(&p, msg.h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
	printf("  cuIpcOpenMemHandle: %s\n", ename(rc));
	if (rc == CUDA_SUCCESS) {
		describe("imported (legacy IPC)", p, 4 << 20);
		printf("  SYNC_MEMOPS on it: %s\n",
		       ename(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p)));
		printf("  dma-buf export of it: %s\n", ename(try_export(p, 4 << 20, NULL)));
		CK(cuIpcCloseMemHandle(p));
		buffer_id(p, &rc);
		printf("  after cuIpcCloseMemHandle: BUFFER_ID -> %s\n", ename(rc));
		rc = cuIpcOpenMemHandle(&p2, msg.h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
		printf("  reopened: %s, %s VA\n", ename(rc), p2 == p ? "same" : "other");
		describe("reopened", p2, 4 << 20);
		{
			CUdeviceptr p3;

			rc = cuIpcOpenMemHandle(&p3, msg.h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
			printf("  opened a second time while open: %s, %s VA\n", ename(rc),
			       p3 == p2 ? "same" : "other");
			if (rc == CUDA_SUCCESS) {
				CK(cuIpcCloseMemHandle(p3));
				buffer_id(p2, &rc);
				printf("  one of two closes: BUFFER_ID at it -> %s\n", ename(rc));
			}
		}
		CK(cuIpcCloseMemHandle(p2));
	}
	printf("ipc (second process): VMM POSIX fd %d, exporter's BUFFER_ID %llu\n", fd, msg.vmm_id);
	rc = cuMemImportFromShareableHandle(&h, (void *)(uintptr_t)fd,
					    CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	printf("  cuMemImportFromShareableHandle: %s\n", ename(rc));
	if (rc == CUDA_SUCCESS) {
		CK(cuMemAddressReserve(&va, msg.vmm_size, 0, 0, 0));
		CK(cuMemMap(va, msg.vmm_size, 0, h, 0));
		acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc.location.id = 0;
		acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		CK(cuMemSetAccess(va, msg.vmm_size, &acc, 1));
		describe("imported (VMM fd)", va, msg.vmm_size);
		printf("  SYNC_MEMOPS on it: %s\n",
		       ename(cuPointerSetAttribute(&one, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, va)));
		printf("  dma-buf export of it: %s\n", ename(try_export(va, msg.vmm_size, NULL)));
		CK(cuMemUnmap(va, msg.vmm_size));
		buffer_id(va, &rc);
		printf("  after cuMemUnmap: BUFFER_ID -> %s\n", ename(rc));
		CK(cuMemMap(va, msg.vmm_size, 0, h, 0));
		CK(cuMemSetAccess(va, msg.vmm_size, &acc, 1));
		describe("remapped same handle", va, msg.vmm_size);
		CK(cuMemUnmap(va, msg.vmm_size));
		CK(cuMemRelease(h));
		CK(cuMemAddressFree(va, msg.vmm_size));
	}
	if (write(sock, &ok, 1) != 1)
		perror("write");
	fflush(stdout);
	_exit(0);
}

static void ipc_probe(int sock, pid_t child)
{
	struct ipc_msg msg = { 0 };
	CUdeviceptr p;
	CUmemGenericAllocationHandle h;
	CUmemAllocationProp prop = { 0 };
	size_t gran = 0;
	int fd = -1, st;
	char ok;

	cuCtxSetCurrent(g_ctx[0]);
	CK(cuMemAlloc(&p, 4 << 20));
	CK(cuIpcGetMemHandle(&msg.h, p));
	msg.legacy_id = buffer_id(p, NULL);
	prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	prop.location.id = 0;
	prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
	msg.vmm_size = gran * 2;
	CK(cuMemCreate(&h, msg.vmm_size, &prop, 0));
	CK(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
	{
		CUdeviceptr va;
		CUmemAccessDesc acc = { 0 };

		CK(cuMemAddressReserve(&va, msg.vmm_size, 0, 0, 0));
		CK(cuMemMap(va, msg.vmm_size, 0, h, 0));
		acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		acc.location.id = 0;
		acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
		CK(cuMemSetAccess(va, msg.vmm_size, &acc, 1));
		msg.vmm_id = buffer_id(va, NULL);
	}
	fflush(stdout);
	send_fd(sock, fd, &msg, sizeof(msg));
	if (read(sock, &ok, 1) != 1)
		perror("read");
	waitpid(child, &st, 0);
}

int main(int argc, char **argv)
{
	int sv[2] = { -1, -1 };
	pid_t child = -1;
	int want_pool = argc < 2, want_multi = argc < 2, want_ipc = argc < 2;

	for (int i = 1; i < argc; i++) {
		want_pool |= !strcmp(argv[i], "pool");
		want_multi |= !strcmp(argv[i], "multi");
		want_ipc |= !strcmp(argv[i], "ipc");
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (want_ipc) {
		/* the importer is forked before this process initialises CUDA */
		socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
		child = fork();
		if (child == 0) {
			close(sv[0]);
			ipc_child(sv[1]);
		}
		close(sv[1]);
	}
	if (cuInit(0) || cuDeviceGetCount(&g_dev_count) || !g_dev_count) {
		printf("no GPU\n");
		return 77;
	}
	for (int i = 0; i < g_dev_count && i < 8; i++) {
		CUdevice d;
		int v = 0, w = 0;
		char name[128];

		cuDeviceGet(&d, i);
		cuDeviceGetName(name, sizeof(name), d);
		cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d);
		cuDeviceGetAttribute(&w, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED, d);
		printf("GPU %d: %s, dma-buf %d, GPUDirect RDMA %d\n", i, name, v, w);
		CK(cuDevicePrimaryCtxRetain(&g_ctx[i], d));
	}
	{
		int v = 0;

		cuDriverGetVersion(&v);
		printf("driver API version %d\n", v);
	}
	if (want_ipc)
		ipc_probe(sv[0], child);
	if (want_multi)
		multi_probe();
	if (want_pool)
		pool_probe();
	return 0;
}
