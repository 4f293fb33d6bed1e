/* SPDX-License-Identifier: MIT */
/*
 * The CUDA driver as bench_hit reaches it: dlopen("libcuda.so.1") (or $GDRCACHE_LIBCUDA), one
 * dlsym of cuGetProcAddress_v2, every other entry point through it -- the way the CUDA runtime and
 * PyTorch reach the driver, so that frees made here are the frees an interception must see.
 * Constants are cuda.h's (CUDA 13.0), copied so that the bench builds without cuda.h.
 */
#ifndef BENCH_HIT_CUDA_H
#define BENCH_HIT_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef int hc_result;
typedef uint64_t hc_ptr; /* CUdeviceptr: unsigned long long, the same 64 bits */

enum {
	HC_ATTR_MEMORY_TYPE = 2,
	HC_ATTR_SYNC_MEMOPS = 6,
	HC_ATTR_BUFFER_ID = 7,
	HC_ATTR_RANGE_START_ADDR = 11,
	HC_ATTR_RANGE_SIZE = 12,
	HC_DMA_BUF_FD = 1,
};

struct hc {
	hc_result (*cuInit)(unsigned);
	hc_result (*cuDeviceGet)(int *, int);
	hc_result (*cuDeviceGetName)(char *, int, int);           /* may be NULL */
	hc_result (*cuDriverGetVersion)(int *);
	hc_result (*cuDevicePrimaryCtxRetain)(void **, int);
	hc_result (*cuCtxSetCurrent)(void *);
	hc_result (*cuMemAlloc)(hc_ptr *, size_t);
	hc_result (*cuMemFree)(hc_ptr);
	hc_result (*cuPointerGetAttribute)(void *, int, hc_ptr);
	hc_result (*cuPointerGetAttributes)(unsigned, int *, void **, hc_ptr);
	hc_result (*cuPointerSetAttribute)(const void *, int, hc_ptr);
	hc_result (*cuMemGetHandleForAddressRange)(void *, hc_ptr, size_t, int, unsigned long long);
	void *ctx;
	char gpu[128];
	char driver[64];     /* kernel driver version from /proc/driver/nvidia/version, or "?" */
	int cuda_version;    /* cuDriverGetVersion */
	int fake;            /* $GDRCACHE_LIBCUDA is set: the fake driver, not a measurement */
};

extern struct hc hc;

/* 0 with a current context on GPU 0, or -1 with why filled in. */
int hc_load(char *why, size_t len);
/* Make the context current on the calling thread. */
void hc_thread(void);
/* The driver's BUFFER_ID of ptr, or 0 when it has none (freed, not CUDA memory). */
uint64_t hc_buffer_id(hc_ptr ptr);
/* Whole allocation holding ptr, with its BUFFER_ID, in one query; -1 if CUDA does not know ptr. */
int hc_query(hc_ptr ptr, uint64_t *base, uint64_t *len, uint64_t *id);
/* The register callbacks the baselines share with libgdrcache's dmabuf backend: SYNC_MEMOPS on
 * the allocation, then a dma-buf export of [base, base+len) (multiples of 4 KiB). 0 and *fd, or -1. */
int hc_pin(hc_ptr base, uint64_t len, int *fd);
void hc_unpin(int fd);

#endif
