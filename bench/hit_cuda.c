/* SPDX-License-Identifier: MIT */
/* The CUDA driver for bench_hit, through cuGetProcAddress_v2 (see hit_cuda.h). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hit_cuda.h"

struct hc hc;

typedef hc_result (*gpa_t)(const char *, void **, int, uint64_t, int *);

int hc_load(char *why, size_t len)
{
	const char *lib = getenv("GDRCACHE_LIBCUDA");
	void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW);
	gpa_t gpa;
	FILE *f;
	int dev;

	hc.fake = lib && *lib;
	if (!h) {
		snprintf(why, len, "no CUDA driver (%s)", dlerror());
		return -1;
	}
	gpa = (gpa_t)dlsym(h, "cuGetProcAddress_v2");
	if (!gpa) {
		snprintf(why, len, "libcuda has no cuGetProcAddress_v2");
		return -1;
	}
#define RES(field, name, required)                                                           \
	do {                                                                                 \
		void *fn_ = NULL;                                                            \
		int st_ = 0;                                                                 \
		if ((gpa(name, &fn_, 12010, 0, &st_) || !fn_) && required) {               \
			snprintf(why, len, "libcuda lacks %s", name);                        \
			return -1;                                                           \
		}                                                                            \
		memcpy(&hc.field, &fn_, sizeof(fn_));                                        \
	} while (0)
	RES(cuInit, "cuInit", 1);
	RES(cuDeviceGet, "cuDeviceGet", 1);
	RES(cuDeviceGetName, "cuDeviceGetName", 0);
	RES(cuDriverGetVersion, "cuDriverGetVersion", 1);
	RES(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 1);
	RES(cuCtxSetCurrent, "cuCtxSetCurrent", 1);
	RES(cuMemAlloc, "cuMemAlloc", 1);
	RES(cuMemFree, "cuMemFree", 1);
	RES(cuPointerGetAttribute, "cuPointerGetAttribute", 1);
	RES(cuPointerGetAttributes, "cuPointerGetAttributes", 1);
	RES(cuPointerSetAttribute, "cuPointerSetAttribute", 1);
	RES(cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 1);
#undef RES
	if (hc.cuInit(0) || hc.cuDeviceGet(&dev, 0)) {
		snprintf(why, len, "no usable GPU (cuInit / cuDeviceGet failed)");
		return -1;
	}
	if (hc.cuDevicePrimaryCtxRetain(&hc.ctx, dev) || hc.cuCtxSetCurrent(hc.ctx)) {
		snprintf(why, len, "cannot make a context on GPU 0");
		return -1;
	}
	strcpy(hc.gpu, hc.fake ? "fake CUDA driver (SIMULATION)" : "?");
	if (!hc.fake && hc.cuDeviceGetName)
		hc.cuDeviceGetName(hc.gpu, sizeof(hc.gpu), dev);
	hc.cuDriverGetVersion(&hc.cuda_version);
	strcpy(hc.driver, "?");
	f = fopen("/proc/driver/nvidia/version", "r");
	if (f) {
		char line[256], *p;

		/* "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release ..." */
		if (fgets(line, sizeof(line), f) && (p = strstr(line, "  "))) {
			while (*p == ' ')
				p++;
			snprintf(hc.driver, sizeof(hc.driver), "%.*s", (int)strcspn(p, " \n"), p);
		}
		fclose(f);
	}
	return 0;
}

void hc_thread(void)
{
	hc.cuCtxSetCurrent(hc.ctx);
}

uint64_t hc_buffer_id(hc_ptr ptr)
{
	unsigned long long id = 0;

	return hc.cuPointerGetAttribute(&id, HC_ATTR_BUFFER_ID, ptr) ? 0 : id;
}

int hc_query(hc_ptr ptr, uint64_t *base, uint64_t *len, uint64_t *id)
{
	int attrs[3] = { HC_ATTR_BUFFER_ID, HC_ATTR_RANGE_START_ADDR, HC_ATTR_RANGE_SIZE };
	unsigned long long bid = 0, start = 0;
	size_t size = 0;
	void *data[3] = { &bid, &start, &size };

	if (hc.cuPointerGetAttributes(3, attrs, data, ptr) || !bid || !size)
		return -1;
	*base = start;
	*len = size;
	*id = bid;
	return 0;
}

int hc_pin(hc_ptr base, uint64_t len, int *fd)
{
	unsigned one = 1;
	int f = -1;

	hc.cuPointerSetAttribute(&one, HC_ATTR_SYNC_MEMOPS, base);
	if (hc.cuMemGetHandleForAddressRange(&f, base, len, HC_DMA_BUF_FD, 0))
		return -1;
	*fd = f;
	return 0;
}

void hc_unpin(int fd)
{
	if (fd >= 0)
		close(fd);
}
