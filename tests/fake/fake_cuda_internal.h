/* SPDX-License-Identifier: MIT */
/*
 * Internal header of the fake CUDA driver: the state and helpers that its files share
 * (fake_cuda.c: entry names, counters and faults, reset; fake_cuda_mem.c: memory model, VA arena
 * and chunks; fake_cuda_alloc.c: allocations and the allocation and free entry points;
 * fake_cuda_vmm.c: VMM reservations and mappings; fake_cuda_attr.c: pointer attributes and
 * dma-buf export; fake_cuda_proc.c: cuGetProcAddress; fake_cuda_ctx.c: devices and contexts;
 * fake_cuda_pool.c: stream-ordered pools and the dma-buf export rule; fake_cuda_ipc.c: memory
 * imported from another process and the VMM entry points). Not for tests: they use fake_cuda.h.
 * Every name here is hidden (the library is built with -fvisibility=hidden).
 */
#ifndef FAKE_CUDA_INTERNAL_H
#define FAKE_CUDA_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))

/* The free and allocation entry points that libgdrcache patches (lib/intercept/entries.h, the one
 * list of them: its SIM rows): their exported symbols are assembly prologues SIMULATING libcuda
 * 580.159.04's entry bytes (fake_entry_<arch>.S) that call fake_impl_<name> (hidden).
 * fake_api_flag is what the x86-64 prologue's RIP-relative cmp reads, as libcuda's does. Elsewhere
 * the C function is the entry point. The rows the fake does not simulate (NOSIM) it does not
 * export: a file that includes the list defines GDR_ENTRY(name, kind, route, fake, ...) as
 * FAKE_IF_##fake(what a simulated row gives). */
#define FAKE_IF_SIM(...) __VA_ARGS__
#define FAKE_IF_NOSIM(...)
#if defined(__x86_64__) || defined(__aarch64__)
#define ENTRY_FN(name) fake_impl_##name
#define ENTRY_EXPORT
#else
#define ENTRY_FN(name) name
#define ENTRY_EXPORT EXPORT
#endif

/* ---- cuda.h's types and values (kept independent of lib/cuda/cuda_abi.h on purpose) ------------- */
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef int CUdriverProcAddressQueryResult;

enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_FOUND = 500,
	CUDA_ERROR_NOT_SUPPORTED = 801,
};

enum {
	ATTR_CONTEXT = 1,
	ATTR_MEMORY_TYPE = 2,
	ATTR_DEVICE_POINTER = 3,
	ATTR_HOST_POINTER = 4,
	ATTR_P2P_TOKENS = 5,
	ATTR_SYNC_MEMOPS = 6,
	ATTR_BUFFER_ID = 7,
	ATTR_IS_MANAGED = 8,
	ATTR_DEVICE_ORDINAL = 9,
	ATTR_IS_LEGACY_CUDA_IPC_CAPABLE = 10,
	ATTR_RANGE_START_ADDR = 11,
	ATTR_RANGE_SIZE = 12,
	ATTR_MAPPED = 13,
	ATTR_ALLOWED_HANDLE_TYPES = 14,
	ATTR_IS_GPU_DIRECT_RDMA_CAPABLE = 15,
	ATTR_ACCESS_FLAGS = 16,
	ATTR_MEMPOOL_HANDLE = 17,
	ATTR_MAPPING_SIZE = 18,
	ATTR_MAPPING_BASE_ADDR = 19,
	ATTR_MEMORY_BLOCK_ID = 20,
	ATTR_IS_HW_DECOMPRESS_CAPABLE = 21,
	ATTR_LAST = 21,
};

#define MEMORYTYPE_HOST 1u
#define MEMORYTYPE_DEVICE 2u
#define CTX_MAP_HOST 0x08u
#define CTX_SYNC_MEMOPS 0x80u
#define CTX_FLAGS_VALID 0xffu
#define DEVICE_ATTRIBUTE_MAX 148
#define DMA_BUF_FD 1
#define DEVATTR_DMA_BUF_SUPPORTED 124
#define PROC_SUCCESS 0
#define PROC_SYMBOL_NOT_FOUND 1
#define PROC_VERSION_NOT_SUFFICIENT 2

/* ---- Devices and contexts (fake_cuda_ctx.c) ------------------------------------------------- */
#define MAX_CREATED_CTX 16

struct CUctx_st {
	int dev;
	bool primary;
	bool live;     /* created contexts: between cuCtxCreate and cuCtxDestroy */
	bool runtime_ref; /* primary contexts: the CUDA runtime's implicit reference (ctx_used) */
	unsigned flags; /* cuCtxSetFlags */
};

extern struct CUctx_st g_primary[FAKE_CUDA_MAX_DEVICES]; /* g_primary[0]: "the fake context" */
extern struct CUctx_st g_created[MAX_CREATED_CTX];
extern int g_ndevices;
extern int g_devattr[FAKE_CUDA_MAX_DEVICES][DEVICE_ATTRIBUTE_MAX];
extern unsigned g_ctx_sync_sets;
extern atomic_bool g_no_context;
extern atomic_bool g_threads_have_context;

void default_devattrs(void);
void ctx_reset_state(void); /* from fake_cuda_reset, lock held */
/* The calling thread's current context (NULL: none, or a destroyed created context). */
CUcontext current_ctx(void);
bool has_context(void);
/* The context a control function allocates in: the current one, else device 0's primary. */
CUcontext control_ctx(void);
bool ctx_valid(CUcontext ctx); /* lock held */
/* Memory is being allocated on behalf of ctx (NULL: none) or dev's primary context; lock held. */
void ctx_used(CUcontext ctx, int dev);

/* ---- Entry points: names, counters, faults -------------------------------------------------- */
/* The entry points the fake has, in enum entry: the intercepted ones it simulates
 * (lib/intercept/entries.h's SIM rows), then these others. */
#define FAKE_OTHER_ENTRIES(X)                                                                      \
	X(cuGetProcAddress) X(cuGetProcAddress_v2) X(cuInit) X(cuDriverGetVersion)                 \
	X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet) X(cuDeviceGetCount)                   \
	X(cuDeviceGetAttribute) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxGetDevice)            \
	X(cuDevicePrimaryCtxRetain)                                                                \
	X(cuCtxGetFlags) X(cuCtxSetFlags) X(cuPointerGetAttribute) X(cuPointerGetAttributes)       \
	X(cuPointerSetAttribute) X(cuMemGetAddressRange_v2)                                          \
	X(cuMemcpyHtoD_v2) X(cuMemcpyDtoH_v2) X(cuIpcOpenMemHandle_v2)                             \
	X(cuDevicePrimaryCtxGetState) X(cuCtxPushCurrent_v2)                                       \
	X(cuCtxPopCurrent_v2) X(cuCtxCreate_v2) X(cuDeviceGetDefaultMemPool)                       \
	X(cuIpcGetMemHandle) X(cuMemRelease)                                                       \
	X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemSetAccess)                               \
	X(cuMemGetAllocationGranularity) X(cuMemExportToShareableHandle)                           \
	X(cuMemImportFromShareableHandle)

enum entry {
#define GDR_ENTRY(name, kind, route, fake, ...) FAKE_IF_##fake(E_##name,)
#include "../../lib/intercept/entries.h"
#define X(n) E_##n,
	FAKE_OTHER_ENTRIES(X)
#undef X
	E_COUNT
};

bool enter(enum entry e, bool need_init, CUresult *rc);
/* An entry's index by its name or, for a _v2 entry, its base name; -1 if none. */
int entry_lookup(const char *name);

#define ENTER(name, need_init)                                                                     \
	do {                                                                                       \
		CUresult enter_rc_;                                                                \
		if (enter(E_##name, need_init, &enter_rc_))                                        \
			return enter_rc_;                                                          \
	} while (0)

/* ---- Memory model (fake_cuda_mem.c, fake_cuda_alloc.c, fake_cuda_vmm.c) -------------------- */
#define CHUNK FAKE_CUDA_CHUNK_SIZE
#define POOL_CHUNK FAKE_CUDA_POOL_CHUNK_SIZE
#define UNIT FAKE_CUDA_SUBALLOC_UNIT
#define UNITS_PER_CHUNK (CHUNK / UNIT)
#define ARENA_SIZE (256ull << 30)
#define PAGE 4096ull
#define K(k) (1u << FAKE_CUDA_KIND_##k)

/* Every tracked object starts with its span, so one sorted-vector code serves them all. */
struct span {
	uint64_t va;
	uint64_t size;
};

struct resv {
	struct span sp;
	uint64_t asked;  /* the size as requested */
	unsigned nmaps;
};

struct chunk {
	struct span sp;   /* what MAPPING_BASE_ADDR / MAPPING_SIZE report */
	int kind;
	int dev;
	CUcontext ctx;    /* owning context (DEVICE, MANAGED, HOST, IPC); NULL for POOL and VMM */
	bool shared;      /* sub-allocates small buffers */
	bool pooled;      /* a pool chunk: its VA belongs to the device's pool region */
	uint64_t va_size; /* VA taken for it, when not sp.size (IPC imports); 0: sp.size */
	uint64_t block_id;
	uint64_t sim_id;
	unsigned live;    /* allocations in it (or overlapping it, for pool chunks) */
	unsigned free_units;
	unsigned hiwater; /* highest unit ever used + 1 */
	uint64_t bitmap[UNITS_PER_CHUNK / 64];
	struct resv *resv;
};

struct ipc_import;

struct alloc {
	struct span sp; /* requested size */
	int kind;
	int dev;
	CUcontext ctx;  /* what CONTEXT reports */
	uint64_t id;
	struct chunk *chunk; /* the chunk holding its first byte */
	unsigned first_unit, nunits;
	unsigned sync_count;
	bool sync;
	struct ipc_import *imp; /* IPC imports */
};

struct vec {
	struct span **v;
	size_t n, cap;
};

struct freed {
	uint64_t va, size, id;
	int kind;
};

extern struct vec g_allocs, g_chunks, g_resvs;
extern bool g_force_new_va;
extern int g_pool_handle[FAKE_CUDA_MAX_DEVICES]; /* what MEMPOOL_HANDLE points at */
extern uint64_t g_last_id; /* the last BUFFER_ID handed out */

void lock(void);
void unlock(void);
size_t vec_upper(const struct vec *v, uint64_t key);
void *vec_find(const struct vec *v, uint64_t addr);
int vec_insert(struct vec *v, void *obj);
void vec_remove(struct vec *v, void *obj);
uint64_t va_get(uint64_t size);
void va_put(uint64_t va, uint64_t size);
bool kind_is_gpu(int kind);
struct chunk *chunk_create(int kind, uint64_t va, uint64_t size, bool shared, struct resv *resv,
			   int dev, CUcontext ctx);
void chunk_release(struct chunk *c);
struct alloc *alloc_new(int kind, uint64_t va, uint64_t size, struct chunk *c, unsigned first,
			unsigned n);
/* Allocate size bytes of kind on dev in ctx (NULL for POOL); the lock is held. VA or 0. */
uint64_t do_alloc(int kind, uint64_t size, int dev, CUcontext ctx);
void do_free(struct alloc *a, struct freed *fr);
void notify(const struct freed *fr);
struct alloc *find_alloc(uint64_t addr);
int free_kind(uint64_t va, unsigned kinds_mask);
/* Map fresh memory of dev at [va, va+size) in a reservation. 0, -EINVAL, -ENOMEM. */
int vmm_map(uint64_t va, uint64_t size, int dev);
/* fake_cuda_reset's, in this order, the lock held: every allocation freed and the free observer
 * gone; the chunks left (none should be) and force-new-VA; the VMM reservations. */
void alloc_reset(void);
void mem_reset(void);
void vmm_reset(void);

/* ---- Pointers (fake_cuda_attr.c) and cuGetProcAddress (fake_cuda_proc.c) -------------------- */
void dmabuf_reset(void); /* the count of dma-buf exports */
void proc_reset(void);   /* hidden symbols and raised versions */

/* fn(path of the descriptor, arg) for every descriptor of this process open on a dma-buf the fake
 * exported (scanning /proc/self/fd), until fn returns false; NULL fn: just count. How many were
 * seen, or -errno. (fake_cuda_attr.c) */
int fake_dmabuf_fds(bool (*fn)(const char *path, void *arg), void *arg);

/* ---- Pools (fake_cuda_pool.c) --------------------------------------------------------------- */
uint64_t pool_alloc(int dev, uint64_t size); /* lock held */
void pool_free(struct alloc *a);             /* lock held; a already out of g_allocs */
/* The dma-buf export rule for [va, va+size) (lock held): CUDA_SUCCESS, INVALID_VALUE or
 * NOT_SUPPORTED (the owning device has DMA_BUF_SUPPORTED 0). */
CUresult export_check(uint64_t va, uint64_t size);
/* Remember that fd (a fake dma-buf) covers [va, va+size) (lock held). */
void export_record(int fd, uint64_t va, uint64_t size);
void pool_reset(void); /* lock held, after every allocation is gone */

/* An entry point's allocation in the current context (POOL: on dev, or the context's device when
 * dev < 0). The lock is not held. */
CUresult entry_alloc(int kind, CUdeviceptr *dptr, size_t size, int dev);

/* ---- Imports (fake_cuda_ipc.c) -------------------------------------------------------------- */
void ipc_forget(struct alloc *a); /* lock held: a (an IPC import) is being freed */
void ipc_reset(void);             /* lock held */

/* ---- Entry points (for the cuGetProcAddress table, fake_cuda_proc.c) ----------------------- */
typedef struct {
	char reserved[64];
} CUipcMemHandle;

/* The intercepted ones the fake simulates: their implementations (fake_cuda_alloc.c,
 * fake_cuda_ctx.c, fake_cuda_pool.c, fake_cuda_ipc.c), then their exported entries (the assembly
 * prologues, lib/intercept/entries.h's SIM rows): what cuGetProcAddress hands out, as dlsym does. */
CUresult ENTRY_FN(cuMemAlloc_v2)(CUdeviceptr *dptr, size_t bytesize);
CUresult ENTRY_FN(cuMemFree_v2)(CUdeviceptr dptr);
CUresult ENTRY_FN(cuMemAllocHost_v2)(void **pp, size_t bytesize);
CUresult ENTRY_FN(cuMemFreeHost)(void *p);
CUresult ENTRY_FN(cuMemAllocManaged)(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult ENTRY_FN(cuMemAllocAsync)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult ENTRY_FN(cuMemFreeAsync)(CUdeviceptr dptr, CUstream hStream);
CUresult ENTRY_FN(cuMemAllocAsync_ptsz)(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult ENTRY_FN(cuMemFreeAsync_ptsz)(CUdeviceptr dptr, CUstream hStream);
CUresult ENTRY_FN(cuMemUnmap)(CUdeviceptr ptr, size_t size);
CUresult ENTRY_FN(cuCtxDestroy)(CUcontext ctx);
CUresult ENTRY_FN(cuCtxDestroy_v2)(CUcontext ctx);
CUresult ENTRY_FN(cuDevicePrimaryCtxReset)(CUdevice dev);
CUresult ENTRY_FN(cuDevicePrimaryCtxReset_v2)(CUdevice dev);
CUresult ENTRY_FN(cuDevicePrimaryCtxRelease)(CUdevice dev);
CUresult ENTRY_FN(cuDevicePrimaryCtxRelease_v2)(CUdevice dev);
CUresult ENTRY_FN(cuIpcCloseMemHandle)(CUdeviceptr dptr);
CUresult ENTRY_FN(cuMemAllocFromPoolAsync)(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
					   CUstream hStream);
CUresult ENTRY_FN(cuMemCreate)(CUmemGenericAllocationHandle *handle, size_t size, const void *prop,
			       unsigned long long flags);
CUresult ENTRY_FN(cuMemMap)(CUdeviceptr ptr, size_t size, size_t offset,
			    CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult ENTRY_FN(cuMemGetHandleForAddressRange)(void *handle, CUdeviceptr dptr, size_t size,
						 int handleType, unsigned long long flags);
#define GDR_ENTRY(name, kind, route, fake, ...)                                                    \
	FAKE_IF_##fake(EXPORT __typeof__(ENTRY_FN(name)) name;)
#include "../../lib/intercept/entries.h"

/* The others. */
EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus);
EXPORT CUresult cuInit(unsigned int flags);
EXPORT CUresult cuDriverGetVersion(int *version);
EXPORT CUresult cuGetErrorName(CUresult error, const char **str);
EXPORT CUresult cuGetErrorString(CUresult error, const char **str);
EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
EXPORT CUresult cuPointerGetAttributes(unsigned int numAttributes, int *attributes, void **data,
				       CUdeviceptr ptr);
EXPORT CUresult cuPointerSetAttribute(const void *value, int attribute, CUdeviceptr ptr);
EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr);
EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n);
EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n);
EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal);
EXPORT CUresult cuDeviceGetCount(int *count);
EXPORT CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx);
EXPORT CUresult cuCtxSetCurrent(CUcontext ctx);
EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx);
EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx);
EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult cuCtxGetDevice(CUdevice *device);
EXPORT CUresult cuCtxGetFlags(unsigned int *flags);
EXPORT CUresult cuCtxSetFlags(unsigned int flags);
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev);
EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr);
EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int flags);
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
				    CUdeviceptr addr, unsigned long long flags);
EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count);
EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const void *prop, int option);
EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle,
					     int handleType, unsigned long long flags);
EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle,
					       int shHandleType);

#endif /* FAKE_CUDA_INTERNAL_H */
