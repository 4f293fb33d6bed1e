/* SPDX-License-Identifier: MIT */
/*
 * Events mode against the real CUDA driver API: random churn of allocations and frees made through
 * the driver, with zero stale registrations (evt.h). Allocators, one churn each, then all mixed:
 *   mem-exported  cuMemAlloc_v2 / cuMemFree_v2 taken by dlsym (the exported symbols)
 *   mem-gpa       cuMemAlloc / cuMemFree taken through cuGetProcAddress_v2 (as the runtime does)
 *   pool          cuMemAllocAsync / cuMemFreeAsync on the default stream (stream-ordered pool)
 *   vmm           cuMemCreate + cuMemAddressReserve + cuMemMap (2 MiB granules); freed by
 *                 cuMemUnmap + cuMemRelease + cuMemAddressFree
 * Built without cuda.h (the few types are declared here) so that it also runs on the fake driver;
 * with -DEVT_CHECK_CUDA_H they are checked against cuda.h. Exits 77 without a GPU, or when
 * events mode is refused. $GDR_TEST_VALIDATE picks the mode (events, tag, auto).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

#include "evt.h"

typedef int CUres;
struct vmm_location { int type; int id; };
struct vmm_prop {
	int type;                   /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
	int requested_handle_types; /* CU_MEM_HANDLE_TYPE_NONE = 0 */
	struct vmm_location location; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
	void *win32_metadata;
	struct {
		unsigned char compression_type;
		unsigned char gpu_direct_rdma_capable;
		unsigned short usage;
		unsigned char reserved[4];
	} alloc_flags;
};
struct vmm_access { struct vmm_location location; int flags; /* READWRITE = 3 */ };

#ifdef EVT_CHECK_CUDA_H
#include <cuda.h>
_Static_assert(sizeof(struct vmm_prop) == sizeof(CUmemAllocationProp), "prop");
_Static_assert(offsetof(struct vmm_prop, location) == offsetof(CUmemAllocationProp, location), "loc");
_Static_assert(offsetof(struct vmm_prop, alloc_flags) == offsetof(CUmemAllocationProp, allocFlags),
	       "flags");
_Static_assert(offsetof(struct vmm_prop, alloc_flags.gpu_direct_rdma_capable) ==
		       offsetof(CUmemAllocationProp, allocFlags.gpuDirectRDMACapable), "rdma");
_Static_assert(sizeof(struct vmm_access) == sizeof(CUmemAccessDesc), "access");
_Static_assert(CU_MEM_ALLOCATION_TYPE_PINNED == 1 && CU_MEM_LOCATION_TYPE_DEVICE == 1 &&
		       CU_MEM_ACCESS_FLAGS_PROT_READWRITE == 3 && CU_POINTER_ATTRIBUTE_BUFFER_ID == 7,
	       "values");
#endif

static CUres (*p_cuInit)(unsigned);
static CUres (*p_cuDeviceGet)(int *, int);
static CUres (*p_cuDevicePrimaryCtxRetain)(void **, int);
static CUres (*p_cuCtxSetCurrent)(void *);
static CUres (*p_cuCtxSynchronize)(void);
static CUres (*p_cuPointerGetAttribute)(void *, int, uint64_t);
static CUres (*p_cuMemAlloc_exp)(uint64_t *, size_t);
static CUres (*p_cuMemFree_exp)(uint64_t);
static CUres (*p_cuMemAlloc_gpa)(uint64_t *, size_t);
static CUres (*p_cuMemFree_gpa)(uint64_t);
static CUres (*p_cuMemAllocAsync)(uint64_t *, size_t, void *);
static CUres (*p_cuMemFreeAsync)(uint64_t, void *);
static CUres (*p_cuMemAddressReserve)(uint64_t *, size_t, size_t, uint64_t, unsigned long long);
static CUres (*p_cuMemAddressFree)(uint64_t, size_t);
static CUres (*p_cuMemCreate)(unsigned long long *, size_t, const struct vmm_prop *,
			      unsigned long long);
static CUres (*p_cuMemRelease)(unsigned long long);
static CUres (*p_cuMemMap)(uint64_t, size_t, size_t, unsigned long long, unsigned long long);
static CUres (*p_cuMemUnmap)(uint64_t, size_t);
static CUres (*p_cuMemSetAccess)(uint64_t, size_t, const struct vmm_access *, size_t);
static int dev;
static int have_vmm;

static uint64_t driver_buffer_id(uint64_t addr)
{
	unsigned long long id = 0;

	return p_cuPointerGetAttribute(&id, 7 /* BUFFER_ID */, addr) ? 0 : id;
}

/* VMM allocations: their handles, found again by address at free time. */
#define MAXV 64
static struct { uint64_t va; unsigned long long h; } vmm[MAXV];

static int vmm_alloc(uint64_t size, uint64_t *ptr)
{
	struct vmm_prop prop;
	struct vmm_access acc;
	unsigned long long h;
	uint64_t va;
	int i;

	for (i = 0; i < MAXV && vmm[i].va; i++)
		;
	if (i == MAXV)
		return -1;
	memset(&prop, 0, sizeof(prop));
	prop.type = 1;
	prop.location.type = 1;
	prop.location.id = dev;
	prop.alloc_flags.gpu_direct_rdma_capable = 1;
	if (p_cuMemCreate(&h, size, &prop, 0))
		return -1;
	if (p_cuMemAddressReserve(&va, size, 0, 0, 0)) {
		p_cuMemRelease(h);
		return -1;
	}
	memset(&acc, 0, sizeof(acc));
	acc.location.type = 1;
	acc.location.id = dev;
	acc.flags = 3;
	if (p_cuMemMap(va, size, 0, h, 0) || p_cuMemSetAccess(va, size, &acc, 1)) {
		p_cuMemUnmap(va, size);
		p_cuMemAddressFree(va, size);
		p_cuMemRelease(h);
		return -1;
	}
	vmm[i].va = va;
	vmm[i].h = h;
	*ptr = va;
	return 0;
}

static int vmm_free(uint64_t ptr, uint64_t size)
{
	for (int i = 0; i < MAXV; i++)
		if (vmm[i].va == ptr) {
			p_cuMemUnmap(ptr, size);
			p_cuMemRelease(vmm[i].h);
			p_cuMemAddressFree(ptr, size);
			vmm[i].va = 0;
			return 0;
		}
	return -1;
}

static const char *const kind_names[] = { "mem-exported", "mem-gpa", "pool", "vmm" };
static int kind_base, kind_count;

static int d_alloc(int k, uint64_t size, uint64_t *ptr)
{
	switch (k + kind_base) {
	case 0: return p_cuMemAlloc_exp(ptr, size);
	case 1: return p_cuMemAlloc_gpa(ptr, size);
	case 2: {
		int rc = p_cuMemAllocAsync(ptr, size, NULL);

		return rc || !p_cuCtxSynchronize ? rc : p_cuCtxSynchronize();
	}
	default: return vmm_alloc(size, ptr);
	}
}

static int d_free(int k, uint64_t ptr, uint64_t size)
{
	switch (k + kind_base) {
	case 0: return p_cuMemFree_exp(ptr);
	case 1: return p_cuMemFree_gpa(ptr);
	case 2: return p_cuMemFreeAsync(ptr, NULL);
	default: return vmm_free(ptr, size);
	}
}

static int d_refusable(int k)
{
	return k + kind_base == 2;
}

static uint64_t d_size(int k, uint64_t *rng)
{
	static const uint64_t sizes[] = { 512, 4096, 60000, 65536, 1 << 20, 2 << 20, 3 << 20,
					  4 << 20, 16 << 20 };

	if (k + kind_base == 3)
		return (uint64_t)(1 + evt_rand(rng) % 3) << 21;
	return sizes[evt_rand(rng) % (sizeof(sizes) / sizeof(sizes[0]))];
}

int main(int argc, char **argv)
{
	void *h = dlopen(getenv("GDRCACHE_LIBCUDA") ? getenv("GDRCACHE_LIBCUDA") : "libcuda.so.1",
			 RTLD_NOW);
	CUres (*gpa)(const char *, void **, int, uint64_t, int *);
	int steps = argc > 1 ? atoi(argv[1]) : 3000, status = 0;
	void *ctx;

	if (!h) {
		printf("SKIP: no CUDA driver (%s)\n", dlerror());
		return 77;
	}
#define SYM(p, n) (*(void **)&(p) = dlsym(h, n))
	if (!SYM(p_cuInit, "cuInit") || !SYM(p_cuDeviceGet, "cuDeviceGet") ||
	    !SYM(p_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") ||
	    !SYM(p_cuCtxSetCurrent, "cuCtxSetCurrent") ||
	    !SYM(p_cuPointerGetAttribute, "cuPointerGetAttribute") ||
	    !SYM(p_cuMemAlloc_exp, "cuMemAlloc_v2") || !SYM(p_cuMemFree_exp, "cuMemFree_v2") ||
	    !SYM(p_cuMemAllocAsync, "cuMemAllocAsync") || !SYM(p_cuMemFreeAsync, "cuMemFreeAsync") ||
	    !SYM(gpa, "cuGetProcAddress_v2")) {
		printf("SKIP: libcuda lacks an entry point the test needs\n");
		return 77;
	}
	SYM(p_cuCtxSynchronize, "cuCtxSynchronize"); /* absent from the fake driver */
	have_vmm = SYM(p_cuMemAddressReserve, "cuMemAddressReserve") &&
		   SYM(p_cuMemAddressFree, "cuMemAddressFree") && SYM(p_cuMemCreate, "cuMemCreate") &&
		   SYM(p_cuMemRelease, "cuMemRelease") && SYM(p_cuMemMap, "cuMemMap") &&
		   SYM(p_cuMemUnmap, "cuMemUnmap") && SYM(p_cuMemSetAccess, "cuMemSetAccess");
	if (p_cuInit(0) || p_cuDeviceGet(&dev, 0) || p_cuDevicePrimaryCtxRetain(&ctx, dev) ||
	    p_cuCtxSetCurrent(ctx)) {
		printf("SKIP: no usable GPU\n");
		return 77;
	}
	{
		int st = 0;

		if (gpa("cuMemAlloc", (void **)&p_cuMemAlloc_gpa, 12010, 0, &st) || !p_cuMemAlloc_gpa ||
		    gpa("cuMemFree", (void **)&p_cuMemFree_gpa, 12010, 0, &st) || !p_cuMemFree_gpa) {
			printf("SKIP: cuGetProcAddress_v2 gives no cuMemAlloc / cuMemFree\n");
			return 77;
		}
	}
	kind_count = have_vmm ? 4 : 3;
	if (!have_vmm)
		printf("# no VMM entry points in this driver: vmm not tested\n");
	for (int k = 0; k <= kind_count; k++) {
		struct evt e;
		struct evt_alloc a = { 1, kind_names, d_alloc, d_free, d_size, d_refusable };
		char what[64];

		if (k < kind_count) { /* one allocator alone */
			kind_base = k;
			snprintf(what, sizeof(what), "driver %s", kind_names[k]);
		} else {              /* all mixed */
			kind_base = 0;
			a.nkinds = kind_count;
			snprintf(what, sizeof(what), "driver mixed");
		}
		evt_init(&e, driver_buffer_id);
		evt_churn(&e, &a, steps, 0x9e3779b97f4a7c15ULL ^ ((uint64_t)(k + 1) << 32));
		status |= evt_report(&e, what);
		if (gdr_cache_destroy(e.cache))
			printf("# gdr_cache_destroy failed\n");
	}
	return status;
}
