/* SPDX-License-Identifier: MIT */
/* A process without a CUDA driver: the cache works for host memory and says clearly that it
 * cannot register GPU memory. Run with GDRCACHE_LIBCUDA naming a library that does not exist. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "cuda/cuda.h"
#include "intercept/hooks.h"
#include "fakes.h"

static void test_host_paths_work(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	enum gdr_backend be;
	char *buf = malloc(4096);

	(void)state;
	assert_int_equal(gdr_driver_load(), -ENODEV);
	assert_int_equal(fake_cache_create(NULL, NULL, &c), 0);
	assert_int_equal(gdr_cache_backend(c, &be), 0);
	assert_int_equal(be, GDR_BACKEND_PEERMEM);   /* no kmod device, no CUDA for dma-buf */
	assert_int_equal(gdr_reg(c, FAKE_PD, buf, 4096, 1, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	/* Without a PD there is nothing the cache can do without CUDA: -ENODEV says why. */
	assert_int_equal(gdr_reg(c, NULL, buf, 4096, 1, &r), -ENODEV);
	assert_int_equal(gdr_cache_destroy(c), 0);
	/* The dmabuf backend needs the driver. */
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND, .backend = GDR_BACKEND_DMABUF };
	assert_int_equal(fake_cache_create(&a, NULL, &c), -ENODEV);
	assert_int_equal(fake_verbs.outstanding, 0);
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_host_paths_work),
	};

	setenv("GDRCACHE_LIBCUDA", "libcuda-that-does-not-exist.so.1", 1);
	setenv("GDRCACHE_KMOD_DEV", "/nonexistent/gdrcache", 1);
	fake_verbs_install();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
