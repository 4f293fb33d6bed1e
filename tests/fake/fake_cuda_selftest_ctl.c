/* SPDX-License-Identifier: MIT */
/*
 * Self-test of the fake CUDA driver, its control API: injected faults and call counters, threads
 * with and without a current context, the free observer, reset, and 8 threads allocating at once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda_selftest.h"

void test_faults_and_counters(void)
{
	CUresult rc;
	uint64_t d = fake_cuda_alloc(4096);

	fake_cuda_reset_counters();
	CHECK_EQ(fake_cuda_fail_next("cuPointerGetAttribute", 999, 2), 0, "arm a fault");
	bufid(d, &rc);
	CHECK_EQ(rc, 999, "first call fails");
	bufid(d, &rc);
	CHECK_EQ(rc, 999, "second call fails");
	bufid(d, &rc);
	CHECK_EQ(rc, SUCCESS, "third call succeeds");
	CHECK_EQ(fake_cuda_calls("cuPointerGetAttribute"), 3, "calls counted, failed ones too");
	CHECK_EQ(fake_cuda_fail_after("cuMemAlloc", 1, 2, 1), 0, "fail_after by base name");
	CUdeviceptr x, y;

	CHECK_EQ(p_cuMemAlloc(&x, 4096), SUCCESS, "skipped call passes");
	CHECK_EQ(p_cuMemAlloc(&y, 4096), 2, "then OUT_OF_MEMORY");
	CHECK_EQ(fake_cuda_calls("cuMemAlloc_v2"), 2, "counted under both names");
	p_cuMemFree(x);
	CHECK_EQ(fake_cuda_fail_next("cuNoSuch", 1, 1), -EINVAL, "unknown entry refused");
	fake_cuda_fail_next("cuMemGetHandleForAddressRange", 2, 1);
	int fd = -1, before = fake_cuda_open_dmabufs();

	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, d & ~4095ull, 4096, 1, 0), 2, "export fault");
	CHECK_EQ(fake_cuda_open_dmabufs(), before, "a failed export leaves no fd");

	CUcontext c = (CUcontext)1;
	unsigned flags;

	fake_cuda_set_no_context(true);
	p_cuCtxGetCurrent(&c);
	CHECK(c == NULL, "no context: cuCtxGetCurrent NULL");
	CHECK_EQ(p_cuCtxGetFlags(&flags), INVALID_CONTEXT, "no context: cuCtxGetFlags");
	CHECK_EQ(p_cuMemGetHandleForAddressRange(&fd, d & ~4095ull, 4096, 1, 0), INVALID_CONTEXT,
		 "no context: export");
	CHECK(bufid(d, &rc) > 0 && rc == SUCCESS, "no context: pointer queries still work (measured)");
	fake_cuda_set_no_context(false);
	CHECK_EQ(p_cuCtxSetCurrent(NULL), SUCCESS, "cuCtxSetCurrent(NULL)");
	p_cuCtxGetCurrent(&c);
	CHECK(c == NULL, "this thread now has no context");
	p_cuCtxSetCurrent(fake_cuda_context());
	p_cuCtxGetCurrent(&c);
	CHECK(c == fake_cuda_context(), "context back");

	int v = 0;

	CHECK(p_cuDeviceGetAttribute(&v, 116, 0) == SUCCESS && v == 1, "GPU_DIRECT_RDMA_SUPPORTED 1");
	CHECK(p_cuDeviceGetAttribute(&v, 124, 0) == SUCCESS && v == 1, "DMA_BUF_SUPPORTED 1");
	CHECK(p_cuDeviceGetAttribute(&v, 102, 0) == SUCCESS && v == 1, "VMM supported 1");
	fake_cuda_set_device_attr(116, 0);
	CHECK(p_cuDeviceGetAttribute(&v, 116, 0) == SUCCESS && v == 0, "device attribute controllable");
	CHECK_EQ(p_cuDeviceGetAttribute(&v, 148, 0), INVALID_VALUE, "attribute 148: INVALID_VALUE");
	CHECK_EQ(p_cuDeviceGetAttribute(&v, 116, 1), INVALID_DEVICE, "device 1: INVALID_DEVICE");
	const char *name = NULL;

	CHECK(p_cuGetErrorName(801, &name) == SUCCESS && !strcmp(name, "CUDA_ERROR_NOT_SUPPORTED"),
	      "cuGetErrorName");
	CHECK(p_cuGetErrorName(12345, &name) == INVALID_VALUE && name == NULL, "unknown error name");
	fake_cuda_free(d);
}

static void *no_ctx_thread(void *arg)
{
	CUcontext c = (CUcontext)1;

	p_cuCtxGetCurrent(&c);
	*(CUcontext *)arg = c;
	return NULL;
}

static unsigned g_observed;
static uint64_t g_observed_id;

static void observer(uint64_t va, uint64_t size, uint64_t id, int kind, void *arg)
{
	(void)va;
	(void)size;
	(void)arg;
	if (kind == FAKE_CUDA_KIND_DEVICE) {
		g_observed++;
		g_observed_id = id;
	}
}

void test_threads_and_reset(void)
{
	pthread_t t;
	CUcontext c = (CUcontext)1;

	fake_cuda_set_threads_have_context(false);
	pthread_create(&t, NULL, no_ctx_thread, &c);
	pthread_join(t, NULL);
	CHECK(c == NULL, "strict mode: a new thread has no current context");
	fake_cuda_set_threads_have_context(true);
	pthread_create(&t, NULL, no_ctx_thread, &c);
	pthread_join(t, NULL);
	CHECK(c == fake_cuda_context(), "default: a new thread has the context");

	fake_cuda_set_free_observer(observer, NULL);
	uint64_t d = fake_cuda_alloc(4096);
	uint64_t id = fake_cuda_buffer_id(d);

	p_cuMemFree(d);
	CHECK(g_observed == 1 && g_observed_id == id, "free observer called with the id");
	fake_cuda_set_free_observer(NULL, NULL);

	d = fake_cuda_alloc(4096);
	fake_cuda_alloc(3 * MIB);
	fake_cuda_vmm_map(fake_cuda_vmm_reserve(2 * MIB), 2 * MIB);
	uint64_t last = fake_cuda_last_buffer_id();

	fake_cuda_reset();
	CHECK_EQ(fake_cuda_live_allocations(), 0, "reset frees everything");
	CHECK_EQ(fake_cuda_live_chunks(), 0, "no chunk left");
	CHECK_EQ(fake_cuda_calls_total(), 0, "counters zero");
	uint64_t d2 = fake_cuda_alloc(4096);

	CHECK(fake_cuda_buffer_id(d2) > last, "ids keep increasing across reset");
	fake_cuda_free(d2);
	CHECK_EQ(fake_cuda_sim_fd(), -1, "sim mode off without FAKE_CUDA_P2P_SIM");
}

struct stress {
	int seed;
	int errors;
};

static void *stress_thread(void *arg)
{
	struct stress *s = arg;
	unsigned seed = (unsigned)s->seed;

	for (int i = 0; i < 2000; i++) {
		size_t size = (rand_r(&seed) % 3 == 0) ? 3 * MIB : 512u * (1 + rand_r(&seed) % 64);
		CUdeviceptr d;
		CUresult rc;

		if (p_cuMemAlloc(&d, size) != SUCCESS) {
			s->errors++;
			continue;
		}
		unsigned long long id = bufid(d + size - 1, &rc);

		if (rc != SUCCESS || id != fake_cuda_buffer_id(d))
			s->errors++;
		((volatile char *)(uintptr_t)d)[size - 1] = 1;
		if (p_cuMemFree(d) != SUCCESS)
			s->errors++;
	}
	return NULL;
}

void test_stress(void)
{
	enum { N = 8 };
	pthread_t t[N];
	struct stress s[N];
	int errors = 0;

	for (int i = 0; i < N; i++) {
		s[i] = (struct stress){ .seed = i + 1 };
		pthread_create(&t[i], NULL, stress_thread, &s[i]);
	}
	for (int i = 0; i < N; i++) {
		pthread_join(t[i], NULL);
		errors += s[i].errors;
	}
	CHECK_EQ(errors, 0, "8 threads allocating, querying and freeing");
	CHECK_EQ(fake_cuda_live_allocations(), 0, "nothing left");
}
