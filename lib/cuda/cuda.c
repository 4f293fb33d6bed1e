/* SPDX-License-Identifier: MIT */
/*
 * The CUDA driver, reached at run time: dlopen("libcuda.so.1"), then every entry point through
 * cuGetProcAddress (as the CUDA runtime itself does), so that the library has no link-time
 * dependency on libcuda and a process without it keeps its host paths.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/config.h"
#include "common/log.h"
#include "cuda/cuda.h"
#include "cuda/cuda_abi.h"

/* The watch of the first gdr_cuda_load that gave one (set before its pthread_once, never changed
 * after), read by the borrows and exports of any thread: always through watch_get. */
static const struct gdr_cuda_watch *watch_set;

static const struct gdr_cuda_watch *watch_get(void)
{
	return __atomic_load_n(&watch_set, __ATOMIC_ACQUIRE);
}

static struct {
	int status; /* 0, or -ENODEV */
	gdr_cuInit_t init;
	gdr_cuDriverGetVersion_t driver_version;
	gdr_cuGetErrorName_t get_error_name;
	gdr_cuPointerGetAttribute_t get_attribute;
	gdr_cuPointerGetAttributes_t get_attributes;
	gdr_cuPointerSetAttribute_t set_attribute;
	gdr_cuCtxGetCurrent_t ctx_get_current;
	gdr_cuCtxSetCurrent_t ctx_set_current;
	gdr_cuDeviceGet_t device_get;
	gdr_cuDeviceGetCount_t device_count;
	gdr_cuDevicePrimaryCtxRetain_t primary_retain;
	gdr_cuDevicePrimaryCtxRelease_t primary_release;    /* NULL: a borrow's retain is kept */
	gdr_cuDevicePrimaryCtxGetState_t primary_get_state; /* NULL: as above */
	gdr_cuCtxGetDevice_t ctx_get_device;
	gdr_cuCtxPushCurrent_t ctx_push;
	gdr_cuCtxPopCurrent_t ctx_pop;
	gdr_cuCtxGetFlags_t ctx_get_flags;
	gdr_cuCtxSetFlags_t ctx_set_flags; /* NULL before CUDA 12.1 */
	gdr_cuDeviceGetAttribute_t device_attr;
	gdr_cuMemGetHandleForAddressRange_t dmabuf; /* NULL before CUDA 11.7 */
	void *handle;                               /* libcuda's dlopen handle (hooks.c) */
} cu = { .status = -ENODEV };

/* Contexts that already have CU_CTX_SYNC_MEMOPS from us. */
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static gdr_CUcontext ctx_done[64];
static unsigned ctx_ndone;

static const char *cu_err(gdr_CUresult rc)
{
	const char *s = NULL;

	if (cu.get_error_name && cu.get_error_name(rc, &s) == GDR_CUDA_SUCCESS && s)
		return s;
	return "CUDA error";
}

/* Whether the calling thread is the process's only one (/proc/self/stat's num_threads is 1), read
 * without the heap. Then no other thread can be inside any function, nor start before this one
 * creates it: what a multi-instruction rewrite of an entry needs. false when it cannot be read. */
static bool only_thread(void)
{
	char buf[1024], *p;
	ssize_t n;
	int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC), field;

	if (fd < 0)
		return false;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return false;
	buf[n] = '\0';
	p = strrchr(buf, ')'); /* the command name, in parentheses, may hold spaces */
	if (!p)
		return false;
	/* ") S ppid ...": field 3 (state) follows; num_threads is field 20 */
	for (field = 2; field < 20 && p; field++)
		p = strchr(p + 1, ' ');
	return p && strtol(p + 1, NULL, 10) == 1;
}

static void cuda_load(void)
{
	const struct gdr_config *cfg = gdr_config_get();
	const struct gdr_cuda_watch *w;
	gdr_cuGetProcAddress_v2_t gpa2;
	gdr_cuGetProcAddress_v1_t gpa1 = NULL;
	bool fresh;
	void *h;
	int rc;

	/* Whether libcuda is loaded already: if not, no thread can be inside it while it is patched. */
	h = dlopen(cfg->libcuda, RTLD_NOW | RTLD_NOLOAD);
	fresh = !h;
	if (h)
		dlclose(h);
	h = dlopen(cfg->libcuda, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		gdr_info("no CUDA driver (%s): GPU memory cannot be registered, host memory can",
			 dlerror());
		return;
	}
	gpa2 = (gdr_cuGetProcAddress_v2_t)dlsym(h, "cuGetProcAddress_v2");
	if (!gpa2)
		gpa1 = (gdr_cuGetProcAddress_v1_t)dlsym(h, "cuGetProcAddress");
	if (!gpa2 && !gpa1) {
		gdr_warn(
			"%s has no cuGetProcAddress: driver too old (CUDA 11.3 or later is needed)",
			cfg->libcuda);
		dlclose(h);
		return;
	}

#define RESOLVE(field, name, required)                                                             \
	do {                                                                                       \
		void *fn_ = NULL;                                                                  \
		int st_ = 0;                                                                       \
		rc = gpa2 ? gpa2(name, &fn_, GDR_CUDA_API_VERSION,                                 \
				 GDR_CU_GET_PROC_ADDRESS_DEFAULT, &st_)                            \
			  : gpa1(name, &fn_, GDR_CUDA_API_VERSION,                                 \
				 GDR_CU_GET_PROC_ADDRESS_DEFAULT);                                 \
		if (rc != GDR_CUDA_SUCCESS || !fn_) {                                              \
			fn_ = NULL;                                                                \
			if (required) {                                                            \
				gdr_warn("CUDA driver lacks %s: GPU paths disabled", name);        \
				return;                                                            \
			}                                                                          \
		}                                                                                  \
		memcpy(&cu.field, &fn_, sizeof(fn_));                                              \
	} while (0)

	RESOLVE(init, "cuInit", true);
	RESOLVE(driver_version, "cuDriverGetVersion", false);
	RESOLVE(get_error_name, "cuGetErrorName", false);
	RESOLVE(get_attribute, "cuPointerGetAttribute", true);
	RESOLVE(get_attributes, "cuPointerGetAttributes", true);
	RESOLVE(set_attribute, "cuPointerSetAttribute", true);
	RESOLVE(ctx_get_current, "cuCtxGetCurrent", true);
	RESOLVE(ctx_set_current, "cuCtxSetCurrent", true);
	RESOLVE(device_get, "cuDeviceGet", true);
	RESOLVE(device_count, "cuDeviceGetCount", false);
	RESOLVE(primary_retain, "cuDevicePrimaryCtxRetain", true);
	RESOLVE(primary_release, "cuDevicePrimaryCtxRelease", false);
	RESOLVE(primary_get_state, "cuDevicePrimaryCtxGetState", false);
	RESOLVE(ctx_get_device, "cuCtxGetDevice", false);
	RESOLVE(ctx_push, "cuCtxPushCurrent", false);
	RESOLVE(ctx_pop, "cuCtxPopCurrent", false);
	RESOLVE(ctx_get_flags, "cuCtxGetFlags", false);
	RESOLVE(ctx_set_flags, "cuCtxSetFlags", false);
	RESOLVE(device_attr, "cuDeviceGetAttribute", true);
	RESOLVE(dmabuf, "cuMemGetHandleForAddressRange", false);
#undef RESOLVE

	/* The oldest driver the library is written for (README.md, "Installing it"). Older ones lack
	 * cuGetProcAddress (refused above) or answer it with entry points of other prototypes. */
	if (cu.driver_version) {
		int v = 0;

		if (cu.driver_version(&v) == GDR_CUDA_SUCCESS && v < GDR_CUDA_MIN_DRIVER) {
			gdr_warn("CUDA driver %d.%d is older than %d.%d: GPU paths disabled",
				 v / 1000, v % 1000 / 10, GDR_CUDA_MIN_DRIVER / 1000,
				 GDR_CUDA_MIN_DRIVER % 1000 / 10);
			dlclose(h);
			return;
		}
	}

	/* "Not loaded when we looked" does not mean "no thread inside it": between that look and the
	 * patching another thread of the program may have loaded libcuda itself and called into it.
	 * Only a process with no other thread is sure to have none inside it. Before cuInit: the
	 * driver starts no thread of its own before it. libcuda stays loaded. */
	w = watch_get();
	if (w && w->loaded)
		w->loaded(h, fresh && only_thread());
	rc = cu.init(0);
	if (rc != GDR_CUDA_SUCCESS) {
		gdr_warn("cuInit failed: %s (%d): GPU paths disabled", cu_err(rc), rc);
		return;
	}
	/* The handle stays open for the life of the process: the entry points live in it. */
	cu.handle = h;
	cu.status = 0;
	gdr_info("CUDA driver loaded from %s", cfg->libcuda);
}

/* No cancellation point acts while the driver is loaded and patched (the patcher reads
 * /proc/self/maps under its lock): a thread cancelled there would leave the entries half patched
 * and the lock held, and the next thread to load the driver (pthread_once runs it again) would
 * wait for ever. A pending cancellation acts at the caller's next cancellation point. */
static void cuda_load_once(void)
{
	int cancel;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	cuda_load();
	pthread_setcancelstate(cancel, NULL);
}

int gdr_cuda_load(const struct gdr_cuda_watch *w)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	const struct gdr_cuda_watch *none = NULL;

	if (w && !watch_get())
		__atomic_compare_exchange_n(&watch_set, &none, w, false, __ATOMIC_ACQ_REL,
					    __ATOMIC_ACQUIRE);
	pthread_once(&once, cuda_load_once);
	return cu.status;
}

/* Whether the driver knows MAPPING_BASE_ADDR / MAPPING_SIZE (CUDA 12.x) and MEMPOOL_HANDLE; cleared
 * on the first refusal, after which the query goes without them. */
static int have_mapping_attrs = 1;

int gdr_cuda_classify(uint64_t addr, struct gdr_ptr_info *info)
{
	/* Zeroed 8-byte slots: each attribute writes its own width (bool, int, u64) into one. */
	uint64_t v[9] = { 0 };
	int attrs[9] = {
		GDR_CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
		GDR_CU_POINTER_ATTRIBUTE_BUFFER_ID,
		GDR_CU_POINTER_ATTRIBUTE_IS_MANAGED,
		GDR_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
		GDR_CU_POINTER_ATTRIBUTE_RANGE_SIZE,
		GDR_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
		GDR_CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
		GDR_CU_POINTER_ATTRIBUTE_MAPPING_SIZE,
		GDR_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
	};
	void *data[9] = { &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8] };
	int rc, with_mapping = __atomic_load_n(&have_mapping_attrs, __ATOMIC_RELAXED);

	if (cu.status)
		return -ENODEV;
	rc = cu.get_attributes(with_mapping ? 9 : 6, attrs, data, addr);
	if (rc == GDR_CUDA_ERROR_INVALID_VALUE && with_mapping) {
		/* An older driver that does not know the mapping attributes. */
		memset(v, 0, sizeof(v));
		rc = cu.get_attributes(6, attrs, data, addr);
		if (rc == GDR_CUDA_SUCCESS) {
			__atomic_store_n(&have_mapping_attrs, 0, __ATOMIC_RELAXED);
			gdr_info(
				"driver lacks CU_POINTER_ATTRIBUTE_MAPPING_*: VMM ranges from RANGE_*, "
				"stream-ordered pool memory pinned as cuMemAlloc memory");
		}
	}
	memset(info, 0, sizeof(*info));
	if (rc == GDR_CUDA_ERROR_INVALID_VALUE)
		return 0; /* not a pointer CUDA knows */
	if (rc != GDR_CUDA_SUCCESS) {
		gdr_err("cuPointerGetAttributes(%#llx): %s (%d)", (unsigned long long)addr,
			cu_err(rc), rc);
		return -EIO;
	}
	info->mem_type = (int)(uint32_t)v[0];
	info->buffer_id = v[1];
	info->managed = (v[2] & 0xff) != 0;
	info->start = info->alloc_start = v[3];
	info->size = info->alloc_size = v[4];
	info->device = (int)(uint32_t)v[5];
	info->pool = v[8] != 0;
	/* For VMM memory RANGE_* is the whole VA reservation, mapped or not; the allocation the
	 * BUFFER_ID belongs to is the mapping. For cuMemAlloc memory the mapping is the driver's chunk
	 * and holds the allocation. So the allocation is the intersection of the two. A stream-ordered
	 * pool allocation may span several of the pool's physical chunks (32 MiB on an H200): the
	 * intersection is then the piece holding addr, and RANGE_* (alloc_start/size) the whole
	 * allocation. The mapping itself is what the pool maps and releases as one: docs/FACTS.md,
	 * "Pool memory". */
	if (v[7] && v[6] + v[7] > v[6]) {
		uint64_t lo = v[6] > info->start ? v[6] : info->start;
		uint64_t hi = v[6] + v[7] < info->start + info->size ? v[6] + v[7]
								     : info->start + info->size;

		info->map_start = v[6];
		info->map_size = v[7];
		if (lo < hi && lo <= addr && addr < hi) {
			info->start = lo;
			info->size = hi - lo;
		}
	}
	return 0;
}

int gdr_cuda_mapping(uint64_t addr, uint64_t *base, uint64_t *size)
{
	uint64_t v[2] = { 0, 0 };
	int attrs[2] = { GDR_CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
			 GDR_CU_POINTER_ATTRIBUTE_MAPPING_SIZE };
	void *data[2] = { &v[0], &v[1] };
	int rc;

	if (cu.status)
		return -ENODEV;
	rc = cu.get_attributes(2, attrs, data, addr);
	if (rc != GDR_CUDA_SUCCESS || !v[1] || v[0] > addr || addr - v[0] >= v[1])
		return -EIO;
	*base = v[0];
	*size = v[1];
	return 0;
}

int gdr_cuda_buffer_id(uint64_t addr, uint64_t *id)
{
	unsigned long long v = 0;
	int rc;

	if (cu.status)
		return -ENODEV;
	rc = cu.get_attribute(&v, GDR_CU_POINTER_ATTRIBUTE_BUFFER_ID, addr);
	if (rc == GDR_CUDA_ERROR_INVALID_VALUE)
		return -ESTALE;
	if (rc != GDR_CUDA_SUCCESS) {
		gdr_err("cuPointerGetAttribute(BUFFER_ID, %#llx): %s (%d)",
			(unsigned long long)addr, cu_err(rc), rc);
		return -EIO;
	}
	*id = v;
	return 0;
}

int gdr_cuda_set_sync_memops(uint64_t addr)
{
	unsigned int one = 1;
	int rc;

	if (cu.status)
		return -ENODEV;
	rc = cu.set_attribute(&one, GDR_CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, addr);
	if (rc == GDR_CUDA_SUCCESS)
		return 0;
	if (rc == GDR_CUDA_ERROR_NOT_SUPPORTED)
		return -EOPNOTSUPP;
	gdr_err("cuPointerSetAttribute(SYNC_MEMOPS, %#llx): %s (%d)", (unsigned long long)addr,
		cu_err(rc), rc);
	return -EIO;
}

/* Contexts the library made current for a call (see context_borrow). */
struct borrow {
	gdr_CUcontext ctx; /* NULL: nothing borrowed */
	gdr_CUdevice dev;
	bool pushed;    /* pushed over another device's context (else set on an empty thread) */
	bool retained;  /* a reference of ours to give back */
	uint64_t token; /* the watch's borrow_begin's, for the release */
};

/* The device's primary context, retained for the life of the process: only with a driver that
 * lacks cuDevicePrimaryCtxGetState / Release (the fake driver's older builds, pre-7.0 drivers). */
static void own_release(uint64_t token)
{
	const struct gdr_cuda_watch *w = watch_get();

	if (w && w->own_release)
		w->own_release(token);
}

static gdr_CUcontext primary_ctx_kept(gdr_CUdevice dev, int device)
{
	static gdr_CUcontext retained[64];
	gdr_CUcontext ctx;

	if (device < 0 || device >= 64)
		return NULL;
	pthread_mutex_lock(&ctx_lock);
	ctx = retained[device];
	if (!ctx && cu.primary_retain(&ctx, dev) == GDR_CUDA_SUCCESS)
		retained[device] = ctx;
	pthread_mutex_unlock(&ctx_lock);
	return ctx;
}

/* Make `device`'s primary context current for one call when the thread has no context (an MPI
 * progress thread: such a thread can query pointers but not export a dma-buf or set context flags,
 * docs/FACTS.md, "Threads without a context") or has another device's (a dma-buf is exported, and
 * SYNC_MEMOPS set, in the memory's own device's context). The primary context is borrowed only
 * while the application keeps it active, with a reference of ours for the call: keeping one for
 * good would make the application's last cuDevicePrimaryCtxRelease free nothing. 0, or -ENXIO
 * (logged). */
static int context_borrow(int device, struct borrow *b)
{
	const struct gdr_cuda_watch *w = watch_get();
	gdr_CUcontext cur = NULL, ctx = NULL;
	gdr_CUdevice dev, cur_dev;
	unsigned int flags = 0;
	int active = 0;

	memset(b, 0, sizeof(*b));
	if (cu.ctx_get_current(&cur) != GDR_CUDA_SUCCESS)
		cur = NULL;
	if (cu.device_get(&dev, device) != GDR_CUDA_SUCCESS) {
		gdr_err("CUDA device %d does not exist", device);
		return -ENXIO;
	}
	if (cur && (!cu.ctx_get_device || !cu.ctx_push || !cu.ctx_pop ||
		    (cu.ctx_get_device(&cur_dev) == GDR_CUDA_SUCCESS && cur_dev == dev)))
		return 0; /* the thread's own context serves */
	if (!cu.primary_get_state || !cu.primary_release) {
		ctx = primary_ctx_kept(dev, device);
	} else {
		b->token = w && w->borrow_begin ? w->borrow_begin() : 0;
		if (cu.primary_get_state(dev, &flags, &active) == GDR_CUDA_SUCCESS && active &&
		    cu.primary_retain(&ctx, dev) == GDR_CUDA_SUCCESS)
			b->retained = true;
		if (w && w->borrow_looked)
			w->borrow_looked(b->retained);
		if (!b->retained && !active) {
			if (cur)
				return 0; /* another's context exports: docs/FACTS.md, "Several GPUs" */
			gdr_err("no CUDA context on this thread and device %d's primary context is "
				"not active",
				device);
			return -ENXIO;
		}
	}
	if (!ctx) {
		gdr_err("no CUDA context on this thread and none for device %d", device);
		return -ENXIO;
	}
	b->dev = dev;
	b->ctx = ctx;
	b->pushed = cur != NULL;
	if ((b->pushed ? cu.ctx_push(ctx) : cu.ctx_set_current(ctx)) != GDR_CUDA_SUCCESS) {
		if (b->retained) {
			own_release(b->token);
			cu.primary_release(dev);
			own_release(0);
		}
		gdr_err("cannot make device %d's primary context current", device);
		memset(b, 0, sizeof(*b));
		return -ENXIO;
	}
	return 0;
}

static void context_return(struct borrow *b)
{
	gdr_CUcontext popped;

	if (!b->ctx)
		return;
	if (b->pushed)
		cu.ctx_pop(&popped);
	else
		cu.ctx_set_current(NULL);
	/* The exported entry point: if the application released its own reference meanwhile, this
	 * one may be the last and free the context's memory; the hook tells (hooks.c, borrow_lock). */
	if (b->retained) {
		own_release(b->token);
		cu.primary_release(b->dev);
		own_release(0);
	}
	b->ctx = NULL;
}

int gdr_cuda_ctx_sync_memops(int device)
{
	gdr_CUcontext ctx = NULL;
	struct borrow b;
	unsigned int flags = 0;
	int rc, ret;

	if (cu.status)
		return -ENODEV;
	if (!cu.ctx_set_flags || !cu.ctx_get_flags)
		return -EOPNOTSUPP;
	ret = context_borrow(device, &b);
	if (ret)
		return ret;
	rc = cu.ctx_get_current(&ctx);
	if (rc != GDR_CUDA_SUCCESS || !ctx) {
		context_return(&b);
		return -ENXIO;
	}
	/* context_borrow leaves another device's context current when the memory's device has no
	 * active primary context (enough for a dma-buf export): the flag must not go there, where
	 * none of this memory's copies run, and be remembered as done. */
	if (cu.ctx_get_device) {
		gdr_CUdevice dev, cur_dev;

		if (cu.device_get(&dev, device) != GDR_CUDA_SUCCESS ||
		    cu.ctx_get_device(&cur_dev) != GDR_CUDA_SUCCESS || cur_dev != dev) {
			context_return(&b);
			return -ENXIO;
		}
	}
	pthread_mutex_lock(&ctx_lock);
	for (unsigned i = 0; i < ctx_ndone; i++)
		if (ctx_done[i] == ctx)
			goto out;
	rc = cu.ctx_get_flags(&flags);
	if (rc == GDR_CUDA_SUCCESS && !(flags & GDR_CU_CTX_SYNC_MEMOPS))
		rc = cu.ctx_set_flags(flags | GDR_CU_CTX_SYNC_MEMOPS);
	if (rc != GDR_CUDA_SUCCESS) {
		gdr_err("cuCtxSetFlags(CU_CTX_SYNC_MEMOPS): %s (%d)", cu_err(rc), rc);
		ret = -EIO;
		goto out;
	}
	if (ctx_ndone < sizeof(ctx_done) / sizeof(ctx_done[0]))
		ctx_done[ctx_ndone++] = ctx;
	ret = 1; /* newly set */
out:
	pthread_mutex_unlock(&ctx_lock);
	context_return(&b);
	return ret;
}

int gdr_cuda_dmabuf_export(uint64_t base, uint64_t len, int device, int *fd)
{
	const struct gdr_cuda_watch *w = watch_get();
	struct borrow b;
	int h = -1;
	int rc, err;

	if (cu.status)
		return -ENODEV;
	if (!cu.dmabuf)
		return -EOPNOTSUPP;
	err = context_borrow(device, &b);
	if (err)
		return err;
	if (w && w->own_export)
		w->own_export(true);
	rc = cu.dmabuf(&h, base, len, GDR_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
	if (w && w->own_export)
		w->own_export(false);
	context_return(&b);
	if (rc != GDR_CUDA_SUCCESS) {
		/* INVALID_VALUE on a range the driver calls device memory: memory it will not export
		 * so (pool memory other than whole chunks of the pool, memory imported with
		 * cuIpcOpenMemHandle: docs/FACTS.md, "Pool memory", "Memory from another process").
		 * The caller logs the refusal, once a call site. */
		if (rc == GDR_CUDA_ERROR_NOT_SUPPORTED || rc == GDR_CUDA_ERROR_INVALID_VALUE)
			return -EOPNOTSUPP;
		gdr_err("cuMemGetHandleForAddressRange(%#llx, %llu): %s (%d)",
			(unsigned long long)base, (unsigned long long)len, cu_err(rc), rc);
		return rc == GDR_CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
	}
	*fd = h;
	return 0;
}

int gdr_cuda_device_count(void)
{
	int n = 0;

	if (cu.status)
		return 0;
	if (!cu.device_count)
		return 1;
	return cu.device_count(&n) == GDR_CUDA_SUCCESS ? n : 0;
}

int gdr_cuda_device_attr(int device, int attr, int *value)
{
	int rc;

	if (cu.status)
		return -ENODEV;
	rc = cu.device_attr(value, attr, device);
	return rc == GDR_CUDA_SUCCESS ? 0 : -EIO;
}

void *gdr_cuda_libcuda_handle(void)
{
	return cu.status ? NULL : cu.handle;
}

void *gdr_cuda_context_borrow(int device, int *err)
{
	struct borrow *b = calloc(1, sizeof(*b));

	*err = cu.status ? cu.status : b ? 0 : -ENOMEM;
	if (!*err)
		*err = context_borrow(device, b);
	if (*err) {
		free(b);
		return NULL;
	}
	return b;
}

void gdr_cuda_context_return(void *borrowed)
{
	if (borrowed) {
		context_return(borrowed);
		free(borrowed);
	}
}

/* Forget which contexts were given CU_CTX_SYNC_MEMOPS: after a context is destroyed its handle may
 * come back for a new context without the flag. */
void gdr_cuda_contexts_changed(void)
{
	pthread_mutex_lock(&ctx_lock);
	ctx_ndone = 0;
	pthread_mutex_unlock(&ctx_lock);
}
