/* SPDX-License-Identifier: MIT */
/*
 * Which range a dma-buf fd holds (lib/intercept/dmabufs.c), against the fake CUDA driver whose
 * cuMemGetHandleForAddressRange the library patched: what the export hook records, what a lookup
 * vouches for, and everything that must make it refuse (a file no export made, a free, memory
 * replaced behind the hook's back, a record pushed out or too old, the library's own exports, a
 * child of fork()).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda/cuda.h"
#include "cuda/cuda_abi.h"
#include "intercept/dmabufs.h"
#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)

/* The fake's exported entries (patched by the library once it loaded the driver). */
gdr_CUresult cuMemFree_v2(gdr_CUdeviceptr p);
gdr_CUresult cuMemAlloc_v2(gdr_CUdeviceptr *p, size_t n);
gdr_CUresult cuMemGetHandleForAddressRange(void *h, gdr_CUdeviceptr p, size_t n, int type,
					   unsigned long long f);

static struct gdr_cache *cache;

static int setup(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				    .validate = GDR_VALIDATE_EVENTS };

	(void)state;
	fake_cuda_reset();
	fake_backend_reset();
	/* A cache in mode events: the driver loaded and patched, the events proven. */
	assert_int_equal(fake_cache_create(&a, &fake_backend_ops, &cache), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	gdr_dmabufs_ttl_ns = 60ull * 1000000000;
	assert_int_equal(gdr_cache_destroy(cache), 0);
	cache = NULL;
	return 0;
}

static uint64_t alloc(size_t n)
{
	gdr_CUdeviceptr p = 0;

	assert_int_equal(cuMemAlloc_v2(&p, n), 0);
	return p;
}

static int export(uint64_t va, size_t n)
{
	int fd = -1;

	assert_int_equal(cuMemGetHandleForAddressRange(&fd, va, n, 1, 0), 0);
	assert_true(fd >= 0);
	return fd;
}

static struct gdr_dmabufs_counts counts(void)
{
	struct gdr_dmabufs_counts c;

	gdr_dmabufs_counts(&c);
	return c;
}

static void test_export_vouched(void **state)
{
	uint64_t a = alloc(2 * MiB), va = 0, size = 0, v0 = counts().vouched;
	int fd = export(a + 65536, 131072), fd2;

	(void)state;
	assert_int_equal(gdr_dmabufs_lookup(fd, &va, &size), 0);
	assert_int_equal(va, a + 65536);
	assert_int_equal(size, 131072);
	/* another fd of the same dma-buf is the same dma-buf */
	fd2 = dup(fd);
	assert_int_equal(gdr_dmabufs_lookup(fd2, &va, &size), 0);
	assert_int_equal(va, a + 65536);
	assert_int_equal(counts().vouched, v0 + 2);
	close(fd2);
	close(fd);
	assert_int_equal(cuMemFree_v2(a), 0);
}

static void test_not_exported_refused(void **state)
{
	uint64_t va, size;
	int m = memfd_create("not-a-dmabuf", MFD_CLOEXEC), fd;

	(void)state;
	assert_true(m >= 0);
	assert_int_equal(ftruncate(m, 65536), 0);
	assert_int_equal(gdr_dmabufs_lookup(m, &va, &size), -ENOENT);
	assert_int_equal(gdr_dmabufs_lookup(-1, &va, &size), -EBADF);
	close(m);
	assert_int_equal(gdr_dmabufs_lookup(m, &va, &size), -EBADF);
	/* the library's own export (its dmabuf backend's) is not the program's */
	assert_int_equal(gdr_cuda_dmabuf_export(fake_cuda_alloc(MiB), MiB, 0, &fd), 0);
	assert_int_equal(gdr_dmabufs_lookup(fd, &va, &size), -ENOENT);
	close(fd);
}

static void test_free_forgets(void **state)
{
	uint64_t a = alloc(MiB), va, size, d0 = counts().dropped;
	int fd = export(a, 65536);

	(void)state;
	assert_int_equal(cuMemFree_v2(a), 0);
	assert_true(counts().dropped > d0);
	assert_int_equal(gdr_dmabufs_lookup(fd, &va, &size), -ENOENT);
	close(fd);
}

/* Freed and allocated again where no hook saw it (the fake's control calls): the BUFFER_ID
 * check alone refuses it. */
static void test_replaced_unseen_refused(void **state)
{
	uint64_t a = fake_cuda_alloc(MiB), b, va, size, s0 = counts().stale;
	int fd = export(a, 65536);

	(void)state;
	assert_int_equal(fake_cuda_free(a), 0);
	b = fake_cuda_alloc(MiB);
	assert_int_equal(b, a); /* the fake reuses the address at once */
	assert_int_equal(gdr_dmabufs_lookup(fd, &va, &size), -ESTALE);
	assert_int_equal(counts().stale, s0 + 1);
	/* and forgotten: asked again, not found */
	assert_int_equal(gdr_dmabufs_lookup(fd, &va, &size), -ENOENT);
	close(fd);
	fake_cuda_free(b);
}

static void test_oldest_pushed_out(void **state)
{
	uint64_t a = alloc(MiB), va, size, e0 = counts().evicted;
	int first = export(a, 65536);

	(void)state;
	for (int i = 0; i < 1024; i++)
		close(export(a, 65536));
	assert_true(counts().evicted > e0);
	assert_true(counts().live <= 1024);
	assert_int_equal(gdr_dmabufs_lookup(first, &va, &size), -ENOENT);
	close(first);
	assert_int_equal(cuMemFree_v2(a), 0);
}

static void test_too_old_refused(void **state)
{
	uint64_t a = alloc(MiB), va, size;
	struct timespec ts = { 0, 5000000 };
	int fd = export(a, 65536);

	(void)state;
	gdr_dmabufs_ttl_ns = 1000000; /* 1 ms */
	nanosleep(&ts, NULL);
	assert_int_equal(gdr_dmabufs_lookup(fd, &va, &size), -ESTALE);
	close(fd);
	assert_int_equal(cuMemFree_v2(a), 0);
}

static void test_fork_child_vouches_nothing(void **state)
{
	uint64_t a = alloc(MiB), va, size;
	int fd = export(a, 65536), status = -1;
	pid_t pid;

	(void)state;
	pid = fork();
	if (pid == 0) {
		alarm(60);
		_exit(gdr_dmabufs_lookup(fd, &va, &size) == -ENOENT ? 0 : 1);
	}
	assert_true(pid > 0);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	assert_int_equal(gdr_dmabufs_lookup(fd, &va, &size), 0); /* the parent still does */
	close(fd);
	assert_int_equal(cuMemFree_v2(a), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_export_vouched, setup, teardown),
		cmocka_unit_test_setup_teardown(test_not_exported_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_free_forgets, setup, teardown),
		cmocka_unit_test_setup_teardown(test_replaced_unseen_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_oldest_pushed_out, setup, teardown),
		cmocka_unit_test_setup_teardown(test_too_old_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_fork_child_vouches_nothing, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
