/* SPDX-License-Identifier: MIT */
/*
 * Which registrations are worth the cache: only memory the CUDA driver calls device memory. The
 * driver is never loaded here: a process that has not loaded libcuda.so.1 (or GDRCACHE_LIBCUDA) has
 * no GPU memory, so its registrations go straight to libibverbs without a driver call, and the
 * cache is never created; whether it has been loaded is asked of the loader again only after it
 * loaded something new. Once the driver is loaded, one cuPointerGetAttribute(MEMORY_TYPE) per
 * registration decides (host memory and pointers the driver does not know: CUDA_ERROR_INVALID_VALUE).
 * The library classifies again, fully (VMM, managed); this is only the pre-filter that keeps host
 * registrations byte-for-byte what they were without the preload.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>

#include "preload.h"

#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_MEMORYTYPE_DEVICE 2

typedef int (*get_attr_fn)(void *data, int attribute, unsigned long long ptr);

static get_attr_fn get_attr;
/* The loader's count of objects ever loaded when the driver was last found not loaded: until it
 * changes, nothing new was loaded and the driver is still absent. */
static unsigned long long absent_at_adds;

static int loads_so_far(struct dl_phdr_info *info, size_t size, void *data)
{
	(void)size;
	*(unsigned long long *)data = info->dlpi_adds;
	return 1; /* the first object says it */
}

static get_attr_fn driver(void)
{
	get_attr_fn f = __atomic_load_n(&get_attr, __ATOMIC_ACQUIRE);
	unsigned long long adds = 0;
	const char *name;
	void *h;

	if (f)
		return f;
	/* A dlopen(RTLD_NOLOAD) of a library that is not loaded searches the library path (several
	 * failed openat): ask it again only after something new was loaded. */
	dl_iterate_phdr(loads_so_far, &adds);
	if (adds && adds == __atomic_load_n(&absent_at_adds, __ATOMIC_RELAXED))
		return NULL;
	name = gdrp_cfg.libcuda; /* GDRCACHE_LIBCUDA, or libcuda.so.1 */
	/* RTLD_NOLOAD: only a driver the program loaded itself. Our reference keeps it loaded. */
	h = dlopen(*name ? name : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		__atomic_store_n(&absent_at_adds, adds, __ATOMIC_RELAXED);
		return NULL;
	}
	*(void **)&f = dlsym(h, "cuPointerGetAttribute");
	if (!f) {
		gdrp_info(
			"the loaded CUDA driver has no cuPointerGetAttribute: GPU buffers pass through");
		dlclose(h);
		return NULL;
	}
	gdrp_debug("CUDA driver found loaded: GPU buffers go through the cache");
	__atomic_store_n(&get_attr, f, __ATOMIC_RELEASE);
	return f;
}

bool gdrp_is_gpu(const void *addr)
{
	get_attr_fn f = driver();
	unsigned int type = 0;

	if (!f || f(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (unsigned long long)(uintptr_t)addr))
		return false;
	return type == CU_MEMORYTYPE_DEVICE;
}

bool gdrp_cuda_loaded(void)
{
	return driver() != NULL;
}
