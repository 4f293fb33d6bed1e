/* SPDX-License-Identifier: MIT */
/*
 * Control API of the fake CUDA driver (tests/fake/fake_cuda.c): a SIMULATION of NVIDIA's
 * libcuda.so.1 for libgdrcache's unit tests, built as a library whose file name and soname are
 * libcuda.so.1, so that the library's dlopen("libcuda.so.1") finds it. A test links this library
 * (target gdr_fake_cuda) to call the functions below; the library under test reaches the same
 * loaded object through dlopen + cuGetProcAddress_v2.
 *
 * What the fake does, and what was measured on a real H100 (driver 580.159.04, CUDA 13.0) and on two
 * H200s (driver API 13000, issue 11) to decide it, is described at the top of fake_cuda.c (threads,
 * devices, errors; where the rest is), fake_cuda_alloc.c (allocations), fake_cuda_vmm.c (VMM),
 * fake_cuda_attr.c (attributes, dma-buf export), fake_cuda_proc.c (cuGetProcAddress),
 * fake_cuda_ctx.c (devices, contexts), fake_cuda_pool.c (pools, dma-buf export rule) and
 * fake_cuda_ipc.c (imports from another process, VMM handles). In short:
 *  - "GPU memory" is ordinary host memory inside one PROT_NONE reservation; live allocations are
 *    readable and writable by the test. VAs are reused at once (same VA, new BUFFER_ID).
 *  - Allocations of at most 1 MiB are sub-allocated first-fit, in 512-byte units, from 2 MiB chunks
 *    (two 4096-byte allocations are 4096 apart); larger ones get their own 2 MiB-aligned chunks,
 *    rounded up to 2 MiB, and a freed chunk's VA goes to the next chunk of the same size (LIFO).
 *  - Stream-ordered pool memory (cuMemAllocAsync) comes from 32 MiB chunks per device; an
 *    allocation may span several; dma-buf export of pool memory works only for whole chunks.
 *  - 1 to 4 devices (fake_cuda_set_device_count), each with a reference-counted primary context;
 *    allocations are made in the calling thread's current context (device 0's when none).
 *  - Every allocation, and every VMM map, gets a new, strictly larger BUFFER_ID; ids never go back,
 *    not even across fake_cuda_reset().
 *  - Bool-typed pointer attributes (IS_MANAGED, MAPPED, SYNC_MEMOPS, IS_GPU_DIRECT_RDMA_CAPABLE, ...)
 *    are written as 4 bytes, as the real driver does (measured): query them into an unsigned int.
 *
 * Thread safety: every function here and every driver entry point may be called from any thread;
 * one mutex inside serialises state changes and queries, call counters are atomic.
 *
 * Conventions: functions returning int return 0 (or a count) on success and -errno on failure;
 * "curesult" arguments are CUresult values (cuda.h's numbers). Addresses are uint64_t.
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Granularities of the simulation. */
#define FAKE_CUDA_CHUNK_SIZE     (2ull << 20) /* physical chunk, VMM granularity */
#define FAKE_CUDA_SUBALLOC_MAX   (1ull << 20) /* largest size sub-allocated from a shared chunk */
#define FAKE_CUDA_SUBALLOC_UNIT  512u         /* sub-allocation granularity and alignment */
#define FAKE_CUDA_DRIVER_VERSION 13000
#define FAKE_CUDA_POOL_CHUNK_SIZE (32ull << 20) /* stream-ordered pool chunk (measured, H200) */
#define FAKE_CUDA_POOL_REGION    (8ull << 30)  /* pool VA per device: most pool memory at once */
#define FAKE_CUDA_MAX_DEVICES    4

/* What kind of memory an allocation is. */
enum fake_cuda_kind {
	FAKE_CUDA_KIND_NONE = 0,
	FAKE_CUDA_KIND_DEVICE = 1,  /* cuMemAlloc */
	FAKE_CUDA_KIND_POOL = 2,    /* cuMemAllocAsync (stream-ordered pool) */
	FAKE_CUDA_KIND_MANAGED = 3, /* cuMemAllocManaged */
	FAKE_CUDA_KIND_HOST = 4,    /* cuMemAllocHost (pinned host memory) */
	FAKE_CUDA_KIND_VMM = 5,     /* cuMemCreate + cuMemMap: one mapping */
	FAKE_CUDA_KIND_IPC = 6,     /* cuIpcOpenMemHandle of a legacy IPC handle (an import) */
};

/* Everything the fake knows about the allocation holding an address. */
struct fake_cuda_alloc_info {
	uint64_t va;                 /* allocation start (VMM: the mapping's start) */
	uint64_t size;               /* requested size (VMM: the mapping's size) */
	uint64_t buffer_id;          /* CU_POINTER_ATTRIBUTE_BUFFER_ID */
	int kind;                    /* enum fake_cuda_kind */
	uint64_t chunk_va;           /* the chunk (2 MiB-granular; POOL: 32 MiB; VMM: the mapping;
				      * IPC: the import) holding its first byte */
	uint64_t chunk_size;
	uint64_t reservation_va;     /* VMM only: the reserved VA range (0 otherwise) */
	uint64_t reservation_size;
	unsigned sync_memops_count;  /* successful cuPointerSetAttribute(SYNC_MEMOPS) calls */
	bool sync_memops;            /* current SYNC_MEMOPS value */
	int device;                  /* DEVICE_ORDINAL */
	void *context;               /* CONTEXT (NULL for POOL and VMM) */
};

/* Called after any allocation is freed (by a control function or a driver entry point, not by
 * fake_cuda_reset), outside the fake's lock, on the freeing thread. */
typedef void (*fake_cuda_free_observer_t)(uint64_t va, uint64_t size, uint64_t buffer_id, int kind,
					  void *arg);

/* ---- State ---------------------------------------------------------------------------------- */

/*
 * Back to defaults: frees every allocation, VMM mapping and reservation (no free observer calls),
 * clears call counters, faults, hidden symbols, minimum-version overrides, device attributes, the
 * device count (back to 1), created contexts, the primary contexts' flags and implicit runtime
 * references (fake_cuda_ctx.c), the SYNC_MEMOPS count, VMM allocation handles, the init error, the
 * no-context switch, force-new-VA, the free observer and the driver version. Keeps: primary
 * retain counts, each thread's context stack, the BUFFER_ID counter (ids only grow), whether cuInit
 * has succeeded (see fake_cuda_deinit), the VA free lists (so VAs keep being reused) and open
 * dma-buf fds (they belong to whoever holds them).
 */
void fake_cuda_reset(void);
/* Forget that cuInit succeeded: every entry point but cuInit, cuDriverGetVersion,
 * cuGetErrorName/String and cuGetProcAddress* returns CUDA_ERROR_NOT_INITIALIZED until cuInit. */
void fake_cuda_deinit(void);
/* Whether cuInit has succeeded. */
bool fake_cuda_initialized(void);

/* ---- Allocations (control functions: they need neither cuInit nor a current context) -------- */

/* cuMemAlloc-like. Returns the VA, 0 on failure (size 0, out of VA, sim provider error). */
uint64_t fake_cuda_alloc(size_t size);
/* cuMemFree-like; accepts the start of a DEVICE, POOL or MANAGED allocation. 0 or -EINVAL. */
int fake_cuda_free(uint64_t va);
/* cuMemAllocAsync / cuMemFreeAsync-like (stream-ordered pool; the stream is not simulated). */
uint64_t fake_cuda_alloc_async(size_t size);
int fake_cuda_free_async(uint64_t va);
/* The allocations above are made in the calling thread's current context, on its device (device
 * 0's primary context when none is current). These two name the device: cuMemAlloc-like in dev's
 * primary context, cuMemAllocAsync-like from dev's default pool. 0 on failure (dev >= the device
 * count included). Pool memory: 32 MiB chunks, see fake_cuda_pool.c. */
uint64_t fake_cuda_alloc_on(int dev, size_t size);
uint64_t fake_cuda_alloc_async_on(int dev, size_t size);
/* cuMemAllocManaged-like (IS_MANAGED = 1, MEMORY_TYPE DEVICE). Free with fake_cuda_free. */
uint64_t fake_cuda_alloc_managed(size_t size);
/* cuMemAllocHost-like (MEMORY_TYPE HOST, has a BUFFER_ID). NULL on failure. */
void *fake_cuda_alloc_host(size_t size);
/* 0, or -EINVAL when p is not the start of a host allocation. */
int fake_cuda_free_host(void *p);

/* VMM. reserve: size rounded up to 2 MiB, returns the 2 MiB-aligned VA, 0 on failure. */
uint64_t fake_cuda_vmm_reserve(size_t size);
/* Map fresh "physical" memory at [va, va+size): 2 MiB multiples, inside one reservation, not
 * overlapping another mapping. New BUFFER_ID. 0, -EINVAL, or -ENOMEM (sim provider). */
int fake_cuda_vmm_map(uint64_t va, size_t size);
/* Unmap whole mappings exactly covering [va, va+size) (a partial unmap is -EINVAL, as cuMemUnmap's
 * CUDA_ERROR_INVALID_VALUE). The pointers become unknown to the driver. */
int fake_cuda_vmm_unmap(uint64_t va, size_t size);
/* Release a reservation: va/size exactly as reserved (size may be the unrounded request).
 * -EBUSY while a mapping remains (cuMemAddressFree returns CUDA_ERROR_INVALID_VALUE then). */
int fake_cuda_vmm_free(uint64_t va, size_t size);

/* Memory from another process (legacy IPC), simulated in this one: what cuIpcGetMemHandle of the
 * DEVICE allocation holding exporter_va then cuIpcOpenMemHandle_v2 in the current context (device
 * 0's primary when none) give: an IPC-kind import at its own VA with its own BUFFER_ID; the same VA
 * while it is open (reference counted). 0 on failure (not DEVICE memory). */
uint64_t fake_cuda_ipc_import(uint64_t exporter_va);
/* cuIpcCloseMemHandle-like: drops one open; the last frees it (free observer called). 0 or
 * -EINVAL (not the start of an import). */
int fake_cuda_ipc_close(uint64_t va);

/* ---- Inspection ----------------------------------------------------------------------------- */

/* BUFFER_ID of the live allocation holding va (interior pointers included); 0 if none. */
uint64_t fake_cuda_buffer_id(uint64_t va);
/* 0 and *out filled, or -ENOENT when no live allocation holds va. */
int fake_cuda_alloc_info(uint64_t va, struct fake_cuda_alloc_info *out);
/* Successful cuPointerSetAttribute(SYNC_MEMOPS) calls on the allocation holding va (0 if none). */
unsigned fake_cuda_sync_memops_count(uint64_t va);
/* cuCtxSetFlags calls that had CU_CTX_SYNC_MEMOPS set, and the context's current flags. */
unsigned fake_cuda_ctx_sync_memops_set_count(void);
unsigned fake_cuda_ctx_flags(void);
/* Device 0's primary context (what cuCtxGetCurrent hands out by default), as an opaque pointer. */
void *fake_cuda_context(void);
/* Device dev's primary context (any dev < FAKE_CUDA_MAX_DEVICES), NULL when out of range. */
void *fake_cuda_primary_context(int dev);
/* cuDevicePrimaryCtxRetain minus Release calls on dev (never reset). */
unsigned fake_cuda_primary_refs(int dev);
/* A context's flags as cuCtxGetFlags reads them (0 for an unknown or destroyed context);
 * fake_cuda_ctx_flags is device 0's primary's. fake_cuda_ctx_sync_memops_set_count counts every
 * context's cuCtxSetFlags calls. */
unsigned fake_cuda_ctx_flags_of(void *ctx);
/*
 * Generation of the "physical" GPU memory behind va, for test doubles of nvidia_p2p_get_pages: a
 * nonzero number that changes whenever the memory at va is replaced (its chunk released and another
 * created there, a VMM unmap + map), and 0 where no GPU memory (a DEVICE, POOL or VMM chunk) backs
 * va: host, managed and unknown memory. It is per chunk: a small buffer freed and reallocated at the
 * same VA inside a live chunk keeps it (same pages, new BUFFER_ID), and the free parts of a live
 * chunk have it too (the driver pins by page, not by allocation).
 */
uint64_t fake_cuda_phys_gen(uint64_t va);
/* Live allocations (all kinds, VMM mappings included) and live chunks (pool chunks and IPC
 * imports included). */
unsigned fake_cuda_live_allocations(void);
unsigned fake_cuda_live_chunks(void);
/* The most recent BUFFER_ID handed out (0 before the first). */
uint64_t fake_cuda_last_buffer_id(void);

/* Calls of one entry point since the last reset, by exported name ("cuMemAlloc_v2") or base name
 * ("cuMemAlloc"); failed and fault-injected calls count. 0 for an unknown name. */
uint64_t fake_cuda_calls(const char *entry);
/* All entry point calls since the last reset. */
uint64_t fake_cuda_calls_total(void);
/* Zero the call counters only. */
void fake_cuda_reset_counters(void);

/* dma-bufs: cuMemGetHandleForAddressRange returns a memfd named "fake-dmabuf:<va>+<size>" (hex),
 * of that size. fake_cuda_open_dmabufs counts those open in the process (scans /proc/self/fd):
 * it proves a test's code closed them. -errno if /proc/self/fd cannot be read. */
int fake_cuda_open_dmabufs(void);
/* The range a fake dma-buf fd was exported for. 0, -EBADF (not open), -EINVAL (not a fake dma-buf). */
int fake_cuda_dmabuf_range(int fd, uint64_t *va, uint64_t *size);
/* Successful dma-buf exports since the last reset. */
uint64_t fake_cuda_dmabuf_exports(void);
/* Bytes of GPU memory still allocated only because an open fake dma-buf covers it: chunks
 * released (all their allocations freed) while a dma-buf of them is open, counted once each until
 * every such dma-buf is closed (measured for pool chunks: exactly the chunk stays allocated). */
uint64_t fake_cuda_dmabuf_held_bytes(void);
/* Live pool chunks of dev's pool (each FAKE_CUDA_POOL_CHUNK_SIZE). */
unsigned fake_cuda_pool_chunks(int dev);

/* ---- Behaviour switches and fault injection ------------------------------------------------- */

/* The next n calls of entry (exported or base name) return curesult and do nothing else.
 * n = 0 disarms. -EINVAL for an unknown entry name. Each call replaces that entry's setting. */
int fake_cuda_fail_next(const char *entry, int curesult, unsigned n);
/* Like fail_next, but lets the next `skip` calls through first. */
int fake_cuda_fail_after(const char *entry, unsigned skip, int curesult, unsigned n);
/* cuGetProcAddress* report this base name as not found (an older driver). 0 or -ENOSPC. */
int fake_cuda_hide_symbol(const char *name);
/* cuGetProcAddress* report VERSION_NOT_SUFFICIENT for name when asked with cudaVersion < version
 * (defaults: cuCtxSetFlags 12010, cuMemGetHandleForAddressRange 11070, as the real driver).
 * 0, -EINVAL (unknown name). */
int fake_cuda_set_symbol_min_version(const char *name, int version);
/* cuInit returns curesult (and initialises nothing) while curesult != 0. */
void fake_cuda_set_init_error(int curesult);
/* true: no thread has a current context, whatever it set or pushed (cuCtxGetCurrent gives NULL;
 * entry points that need one
 * return CUDA_ERROR_INVALID_CONTEXT, as measured: cuCtxGet/SetFlags, cuMemGetHandleForAddressRange,
 * cuMemAlloc*, cuMemGetAddressRange, DEVICE_POINTER). Pointer attribute queries need no context. */
void fake_cuda_set_no_context(bool on);
/* Whether a thread that never called cuCtxSetCurrent, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2 or
 * cuCtxCreate_v2 has device 0's primary context current (at the bottom of its stack). Default true
 * (as in a program whose threads all used the CUDA runtime); false is the real driver API's default
 * for a new thread: no current context. */
void fake_cuda_set_threads_have_context(bool on);
/* How many devices cuDeviceGetCount reports (1..FAKE_CUDA_MAX_DEVICES; default 1): each has its
 * own primary context and default pool. 0 or -EINVAL. Reset to 1 by fake_cuda_reset. */
int fake_cuda_set_device_count(int n);
/* cuDeviceGetAttribute(attr) returns value on EVERY device (a test written for one GPU keeps its
 * meaning whichever device it allocates on). 0, -EINVAL (attr out of range). */
int fake_cuda_set_device_attr(int attr, int value);
/* The same for one device (dev < FAKE_CUDA_MAX_DEVICES). 0, -EINVAL. */
int fake_cuda_set_device_attr_dev(int dev, int attr, int value);
/* cuDriverGetVersion's answer (default 13000). */
void fake_cuda_set_driver_version(int version);
/* true: never reuse a VA: new chunks and sub-allocations go above everything used before. */
void fake_cuda_force_new_va(bool on);
/* Install (or with NULL remove) a function called at the start of every driver entry point, before
 * it counts the call or does anything, outside the fake's lock, on the calling thread: a test can
 * stop a thread inside the driver there (a free in flight). Not reset by fake_cuda_reset. */
void fake_cuda_set_enter_hook(void (*cb)(const char *entry, void *arg), void *arg);
/* Install (or with NULL remove) the free observer. */
void fake_cuda_set_free_observer(fake_cuda_free_observer_t cb, void *arg);

/* ---- Simulated NVIDIA P2P provider (tests/kmod/nvp2p_sim_uapi.h) ----------------------------- */
/* When the environment variable FAKE_CUDA_P2P_SIM names a device (e.g. /dev/nvp2p_sim) at the
 * fake's first use, every DEVICE, POOL and VMM chunk is declared to it with NVP2P_SIM_IOCTL_ALLOC on
 * creation and NVP2P_SIM_IOCTL_FREE on release (firing the provider's free callbacks). */
/* The open provider fd, or -1 when sim mode is off. */
int fake_cuda_sim_fd(void);
/* The provider's id for the chunk holding va; 0 if none or sim mode is off. */
uint64_t fake_cuda_sim_id(uint64_t va);

#ifdef __cplusplus
}
#endif

#endif /* FAKE_CUDA_H */
