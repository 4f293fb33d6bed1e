/* SPDX-License-Identifier: MIT */
/*
 * Self-test of the fake CUDA driver, several devices and their contexts (fake_cuda_ctx.c), as
 * measured on two H200s: primary contexts per device, push/pop, created contexts, export from
 * any current context, the last release and reset freeing only that device's context memory.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>

#include "fake_cuda_selftest.h"

typedef CUresult (*retain_t)(CUcontext *, int);
typedef CUresult (*devop_t)(int);
typedef CUresult (*state_t)(int, unsigned *, int *);
typedef CUresult (*ctxdev_t)(int *);
typedef CUresult (*ctxpop_t)(CUcontext *);
typedef CUresult (*ctxcreate_t)(CUcontext *, unsigned, int);
typedef CUresult (*count_t)(int *);
typedef CUresult (*devget_t)(int *, int);

static unsigned g_ctx_frees;

static void ctx_observer(uint64_t va, uint64_t size, uint64_t id, int kind, void *arg)
{
	(void)va;
	(void)size;
	(void)id;
	(void)kind;
	(void)arg;
	g_ctx_frees++;
}

void test_devices(void)
{
	retain_t retain = (retain_t)resolve("cuDevicePrimaryCtxRetain", 12000);
	devop_t release = (devop_t)resolve("cuDevicePrimaryCtxRelease", 12000);
	devop_t preset = (devop_t)resolve("cuDevicePrimaryCtxReset", 12000);
	state_t getstate = (state_t)resolve("cuDevicePrimaryCtxGetState", 12000);
	ctxdev_t getdev = (ctxdev_t)resolve("cuCtxGetDevice", 12000);
	ctxset_t push = (ctxset_t)resolve("cuCtxPushCurrent", 12000);
	ctxpop_t pop = (ctxpop_t)resolve("cuCtxPopCurrent", 12000);
	ctxcreate_t create = (ctxcreate_t)resolve("cuCtxCreate", 12000);
	ctxset_t destroy = (ctxset_t)resolve("cuCtxDestroy", 12000);
	count_t getcount = (count_t)resolve("cuDeviceGetCount", 12000);
	devget_t devget = (devget_t)resolve("cuDeviceGet", 12000);
	CUcontext c0 = NULL, c1 = NULL, c = NULL;
	CUdeviceptr d0, d1;
	CUresult rc;
	int n = 0, dev = -1, active = -1;
	unsigned flags;

	fake_cuda_reset();
	CHECK_EQ(fake_cuda_set_device_count(5), -EINVAL, "device count: at most 4");
	CHECK_EQ(fake_cuda_set_device_count(2), 0, "two devices");
	CHECK(getcount(&n) == SUCCESS && n == 2, "cuDeviceGetCount 2");
	CHECK(devget(&dev, 1) == SUCCESS && dev == 1 && devget(&dev, 2) == INVALID_DEVICE,
	      "cuDeviceGet: 1 exists, 2 does not");
	/* driver-API style: retained before use */
	CHECK(retain(&c0, 0) == SUCCESS && retain(&c1, 1) == SUCCESS && c0 && c1 && c0 != c1,
	      "each device its own primary context");
	CHECK(c1 == fake_cuda_primary_context(1), "fake_cuda_primary_context");
	p_cuCtxSetCurrent(c1);
	CHECK(getdev(&dev) == SUCCESS && dev == 1, "cuCtxGetDevice: the current context's device");
	CHECK_EQ(p_cuMemAlloc(&d1, 4 * MIB), SUCCESS, "cuMemAlloc with GPU1's context current");
	p_cuPointerGetAttribute(&c, A_CONTEXT, d1);
	CHECK(attr_u32(A_DEVICE_ORDINAL, d1) == 1 && c == c1,
	      "GPU1 memory: DEVICE_ORDINAL 1, CONTEXT GPU1's context");
	p_cuCtxSetCurrent(c0);
	CHECK_EQ(p_cuMemAlloc(&d0, 4 * MIB), SUCCESS, "cuMemAlloc on GPU0");
	CHECK_EQ(attr_u32(A_DEVICE_ORDINAL, d0), 0, "GPU0 memory: DEVICE_ORDINAL 0");
	uint64_t h0 = fake_cuda_alloc_on(0, 4096), h1 = fake_cuda_alloc_on(1, 4096);

	CHECK(attr_u32(A_DEVICE_ORDINAL, h0) == 0 && attr_u32(A_DEVICE_ORDINAL, h1) == 1 &&
	      fake_cuda_alloc_on(2, 4096) == 0, "fake_cuda_alloc_on: on the device asked, existing only");
	uint64_t q1 = fake_cuda_alloc_async_on(1, MIB);

	CHECK_EQ(attr_u32(A_DEVICE_ORDINAL, q1), 1, "fake_cuda_alloc_async_on: the pool's device");

	/* export of GPU1 memory: any current context works, none does not */
	p_cuCtxSetCurrent(NULL);
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), INVALID_CONTEXT, "export GPU1 memory, no context");
	p_cuCtxSetCurrent(c0);
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), SUCCESS, "export GPU1 memory, GPU0's context");
	CHECK(push(c1) == SUCCESS && getdev(&dev) == SUCCESS && dev == 1, "cuCtxPushCurrent");
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), SUCCESS, "export GPU1 memory, GPU1's context");
	CHECK(pop(&c) == SUCCESS && c == c1 && getdev(&dev) == SUCCESS && dev == 0,
	      "cuCtxPopCurrent: back to GPU0's");

	/* a created context: its memory exports with GPU0's primary; destroy frees only it */
	CUcontext own = NULL;
	CUdeviceptr o;

	CHECK(create(&own, 0, 1) == SUCCESS && own != c1, "cuCtxCreate on GPU1");
	CHECK_EQ(p_cuMemAlloc(&o, 2 * MIB), SUCCESS, "allocate in it (it is current)");
	p_cuPointerGetAttribute(&c, A_CONTEXT, o);
	CHECK(c == own, "its memory reports it as CONTEXT");
	CHECK(pop(&c) == SUCCESS && c == own, "pop it: GPU0's primary again");
	CHECK_EQ(export_range(o, 2 * MIB, NULL), SUCCESS, "export a created context's memory, GPU0's current");
	CHECK_EQ(destroy(own), SUCCESS, "cuCtxDestroy");
	bufid(o, &rc);
	CHECK(rc == INVALID_VALUE && bufid(d1, &rc) && rc == SUCCESS,
	      "cuCtxDestroy frees its memory only");

	/* per-device attributes */
	CHECK_EQ(fake_cuda_set_device_attr_dev(1, 124, 0), 0, "set DMA_BUF_SUPPORTED 0 on GPU1");
	int v0 = -1, v1 = -1;

	p_cuDeviceGetAttribute(&v0, 124, 0);
	p_cuDeviceGetAttribute(&v1, 124, 1);
	CHECK(v0 == 1 && v1 == 0, "per-device attribute");
	CHECK_EQ(export_range(d1, 4 * MIB, NULL), NOT_SUPPORTED, "export checks the memory's device");
	fake_cuda_set_device_attr_dev(1, 124, 1);

	/* GPU1's primary context: a release that is not the last frees nothing; the last does */
	fake_cuda_set_free_observer(ctx_observer, NULL);
	g_ctx_frees = 0;
	CHECK(retain(&c, 1) == SUCCESS && release(1) == SUCCESS && bufid(d1, &rc) && rc == SUCCESS,
	      "primary release, not the last: memory valid");
	CHECK_EQ(release(1), SUCCESS, "the last release of GPU1's primary context");
	bufid(d1, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "GPU1's context memory freed (BUFFER_ID query INVALID_VALUE)");
	CHECK_EQ(fake_cuda_buffer_id(h1), 0, "all of it");
	CHECK_EQ(g_ctx_frees, 2, "free observer called for each");
	CHECK(bufid(q1, &rc) && rc == SUCCESS, "GPU1's pool memory stays valid");
	CHECK(bufid(d0, &rc) && rc == SUCCESS && fake_cuda_buffer_id(h0), "GPU0's memory untouched");
	CHECK(getstate(1, &flags, &active) == SUCCESS && active == 0, "GetState: active 0 after the last release");
	CHECK(getstate(0, &flags, &active) == SUCCESS && active == 1, "GPU0's still active");
	fake_cuda_set_free_observer(NULL, NULL);

	/* reset of GPU1: its context memory goes, GPU0's and VMM memory stay */
	uint64_t r = fake_cuda_vmm_reserve(2 * MIB);

	p_cuCtxSetCurrent(c1);
	p_cuMemAlloc(&d1, MIB);
	CHECK_EQ(fake_cuda_vmm_map(r, 2 * MIB), 0, "VMM memory on GPU1");
	CHECK_EQ(preset(1), SUCCESS, "cuDevicePrimaryCtxReset(GPU1)");
	CHECK(fake_cuda_buffer_id(d1) == 0 && fake_cuda_buffer_id(d0) != 0,
	      "reset frees GPU1's context memory, GPU0's stays");
	CHECK(fake_cuda_buffer_id(r) != 0, "VMM memory survives the reset (assumed)");
	fake_cuda_vmm_unmap(r, 2 * MIB);
	fake_cuda_vmm_free(r, 2 * MIB);
	p_cuCtxSetCurrent(c0);
	release(0);
	fake_cuda_reset();
	CHECK(getcount(&n) == SUCCESS && n == 1, "reset: one device again");
}
