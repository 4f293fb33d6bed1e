/* SPDX-License-Identifier: MIT */
/*
 * Events mode against frees made by the CUDA runtime, which never calls the driver's exported
 * symbols (it takes cuGetProcAddress_v2 by dlsym once): random churn with zero stale
 * registrations (evt.h). Allocators: cudaMalloc / cudaFree, and cudaMallocAsync / cudaFreeAsync on
 * a stream (stream-ordered pool). The runtime is initialised before the cache is created (the
 * harder order for an interception). Build with nvcc, linked with -lgdrcache -lcuda, with the
 * static (default) or the shared cudart. Exits 77 without a GPU or when events mode is refused.
 */
#include <cuda.h>
#include <cuda_runtime.h>

#include "evt.h"

static cudaStream_t stream;
static int kind_base;

static uint64_t rt_buffer_id(uint64_t addr)
{
	unsigned long long id = 0;

	return cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, (CUdeviceptr)addr) ? 0 : id;
}

static int rt_alloc(int k, uint64_t size, uint64_t *ptr)
{
	void *p = NULL;
	cudaError_t rc;

	if (k + kind_base == 0) {
		rc = cudaMalloc(&p, size);
	} else {
		rc = cudaMallocAsync(&p, size, stream);
		if (rc == cudaSuccess)
			rc = cudaStreamSynchronize(stream);
	}
	*ptr = (uint64_t)(uintptr_t)p;
	return rc == cudaSuccess ? 0 : -1;
}

static int rt_free(int k, uint64_t ptr, uint64_t size)
{
	(void)size;
	if (k + kind_base == 0)
		return cudaFree((void *)(uintptr_t)ptr) == cudaSuccess ? 0 : -1;
	return cudaFreeAsync((void *)(uintptr_t)ptr, stream) == cudaSuccess ? 0 : -1;
}

static int rt_refusable(int k)
{
	return k + kind_base == 1;
}

static uint64_t rt_size(int k, uint64_t *rng)
{
	static const uint64_t sizes[] = { 512, 4096, 60000, 65536, 1 << 20, 2 << 20, 3 << 20,
					  4 << 20, 16 << 20 };

	(void)k;
	return sizes[evt_rand(rng) % (sizeof(sizes) / sizeof(sizes[0]))];
}

int main(int argc, char **argv)
{
	static const char *const names[] = { "cudaMalloc", "cudaMallocAsync" };
	int steps = argc > 1 ? atoi(argv[1]) : 3000, n = 0, status = 0;
	int rtv = 0;

	if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
		printf("SKIP: no GPU for the CUDA runtime\n");
		return 77;
	}
	cudaRuntimeGetVersion(&rtv);
	printf("# CUDA runtime %d\n", rtv);
	if (cudaFree(0) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess) {
		printf("SKIP: the CUDA runtime does not start\n");
		return 77;
	}
	for (int k = 0; k <= 2; k++) {
		struct evt e;
		struct evt_alloc a = { 1, names, rt_alloc, rt_free, rt_size, rt_refusable };
		char what[64];

		if (k < 2) {
			kind_base = k;
			snprintf(what, sizeof(what), "runtime %s", names[k]);
		} else {
			kind_base = 0;
			a.nkinds = 2;
			snprintf(what, sizeof(what), "runtime mixed");
		}
		evt_init(&e, rt_buffer_id);
		evt_churn(&e, &a, steps, 0x2545f4914f6cdd1dULL ^ ((uint64_t)(k + 1) << 32));
		cudaStreamSynchronize(stream);
		status |= evt_report(&e, what);
		if (gdr_cache_destroy(e.cache))
			printf("# gdr_cache_destroy failed\n");
	}
	return status;
}
