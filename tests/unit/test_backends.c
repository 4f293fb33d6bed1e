/* SPDX-License-Identifier: MIT */
/* The three backends through the public API: kmod (against a fake of gdrcache.ko's system calls),
 * dmabuf (dma-bufs exported by the fake CUDA driver, closed on eviction, staleness and destroy),
 * peermem (no pin without a PD), and the automatic choice between them. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <cmocka.h>

#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)

static struct gdr_cache *create(int backend)
{
	/* Mode tag: frees here go through the fake's control calls, which no hook sees. */
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE,
				    .backend = backend, .validate = GDR_VALIDATE_TAG };
	struct gdr_cache *c = NULL;

	assert_int_equal(fake_cache_create(&a, NULL, &c), 0);
	return c;
}

static int setup(void **state)
{
	(void)state;
	fake_cuda_reset();
	fake_verbs = (struct fake_verbs_state){ 0 };
	fake_kmod = (struct fake_kmod_state){ .present = true, .major = GDRCACHE_UAPI_VERSION_MAJOR };
	return 0;
}

static void test_kmod(void **state)
{
	struct gdr_cache *c = create(GDR_BACKEND_KMOD);
	uint64_t a = fake_cuda_alloc(4 * MiB), handle, pages[64];
	uint32_t psize, pcount;
	struct gdr_region *r;
	enum gdr_backend be;

	(void)state;
	assert_int_equal(gdr_cache_backend(c, &be), 0);
	assert_int_equal(be, GDR_BACKEND_KMOD);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)(a + 1000), 5000, 0, &r), 0);
	assert_int_equal(gdr_region_kmod(r, &handle, &psize, &pcount), 0);
	assert_int_not_equal(handle, 0);
	assert_int_equal(psize, 65536);
	assert_int_equal(pcount, 64);               /* the whole 4 MiB allocation */
	assert_int_equal(gdr_region_pages(r, pages, 64), 64);
	assert_int_equal(pages[1] - pages[0], 65536);
	assert_int_equal(gdr_region_pages(r, pages, 2), 64); /* count even when short */
	assert_int_equal(fake_kmod.outstanding, 1);
	assert_int_equal(gdr_dereg(r), 0);
	/* Stale after free + realloc: the old handle is unpinned, a new one made. */
	fake_cuda_free(a);
	assert_int_equal(fake_cuda_alloc(4 * MiB), a);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	uint64_t h2;
	assert_int_equal(gdr_region_kmod(r, &h2, NULL, NULL), 0);
	assert_int_not_equal(h2, handle);
	assert_int_equal(fake_kmod.outstanding, 1);
	/* BAR exhaustion reported by the module: evict and retry. */
	uint64_t b = fake_cuda_alloc(2 * MiB);
	struct gdr_region *rb;
	assert_int_equal(gdr_dereg(r), 0);
	fake_kmod.pin_fail_rc = -ENOSPC;
	fake_kmod.pin_fail_n = 1;
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)b, 4096, 0, &rb), 0);
	struct gdr_cache_stats s;
	gdr_cache_get_stats(c, &s);
	assert_int_equal(s.fail_pin_retried, 1);
	assert_int_equal(fake_kmod.outstanding, 1);
	assert_int_equal(gdr_dereg(rb), 0);
	assert_int_equal(fake_kmod.ioctls_bad, 0);  /* the library never sent a malformed ioctl */
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_true(fake_kmod.closed);
	assert_int_equal(fake_kmod.outstanding, 0);
	fake_cuda_free(a);
	fake_cuda_free(b);
}

/* A free the kernel saw (the module's revocation area) makes the entry stale without any
 * BUFFER_ID query to the driver. */
static void test_kmod_revocation(void **state)
{
	struct gdr_cache *c = create(GDR_BACKEND_KMOD);
	uint64_t a = fake_cuda_alloc(4 * MiB), tag_queries;
	struct gdr_region *r;
	struct gdr_cache_stats s;

	(void)state;
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(fake_kmod_revoke(a), 1);
	tag_queries = fake_cuda_calls("cuPointerGetAttribute");
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(fake_cuda_calls("cuPointerGetAttribute"), tag_queries);
	gdr_cache_get_stats(c, &s);
	assert_int_equal(s.revoked, 1);
	assert_int_equal(s.stale, 1);
	assert_int_equal(s.pins, 2);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
}

static int probe_ok(const char **why)
{
	*why = "";
	return 0;
}

/* The same in mode events, where a hit goes the inline hit path: a backend that revokes makes it
 * check the revocation area out of line, with the hold taken. Not revoked: a lock-free hit, no
 * driver call; revoked: the entry is retired, the hold given back, and the memory pinned again. */
static void test_kmod_revocation_events(void **state)
{
	struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_VALIDATE,
				     .backend = GDR_BACKEND_KMOD,
				     .validate = GDR_VALIDATE_EVENTS };
	int (*probe)(const char **) = fake_seams.events_probe;
	uint64_t a, calls, hits;
	struct gdr_region *r, *r2;
	struct gdr_cache_stats s;
	struct gdr_cache *c = NULL;

	(void)state;
	fake_seams.events_probe = probe_ok;
	assert_int_equal(fake_cache_create(&at, NULL, &c), 0);
	a = fake_cuda_alloc(4 * MiB);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	gdr_cache_get_stats(c, &s);
	hits = s.fast_hits;
	calls = fake_cuda_calls_total();
	for (int i = 0; i < 3; i++) {
		assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)(a + 8192 * i), 4096, 0, &r),
				 0);
		/* held twice: a second hit while the first is held */
		assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r2), 0);
		assert_ptr_equal(r, r2);
		assert_int_equal(gdr_dereg(r2), 0);
		assert_int_equal(gdr_dereg(r), 0);
	}
	assert_int_equal(fake_cuda_calls_total(), calls);
	gdr_cache_get_stats(c, &s);
	assert_int_equal(s.fast_hits, hits + 6);
	assert_int_equal(s.pins, 1);
	assert_int_equal(fake_kmod_revoke(a), 1);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	gdr_cache_get_stats(c, &s);
	assert_int_equal(s.revoked, 1);
	assert_int_equal(s.stale, 1);
	assert_int_equal(s.pins, 2);
	assert_int_equal(s.fast_hits, hits + 6);
	assert_int_equal(fake_kmod.outstanding, 1); /* the revoked pin was let go */
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	gdr_cache_get_stats(c, &s);
	assert_int_equal(s.fast_hits, hits + 7);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_kmod.outstanding, 0);
	fake_cuda_free(a);
	fake_seams.events_probe = probe;
}

static void test_kmod_unavailable(void **state)
{
	struct gdr_cache_attr a = { .field_mask = GDR_CACHE_ATTR_BACKEND, .backend = GDR_BACKEND_KMOD };
	struct gdr_cache *c;

	(void)state;
	fake_kmod.present = false;
	assert_int_equal(fake_cache_create(&a, NULL, &c), -ENODEV);
	fake_kmod.present = true;
	fake_kmod.major = GDRCACHE_UAPI_VERSION_MAJOR + 1; /* a module from the future */
	assert_int_equal(fake_cache_create(&a, NULL, &c), -ENODEV);
}

static void test_auto_choice(void **state)
{
	struct gdr_cache *c;
	enum gdr_backend be;

	(void)state;
	c = create(GDR_BACKEND_AUTO);
	gdr_cache_backend(c, &be);
	assert_int_equal(be, GDR_BACKEND_KMOD);
	gdr_cache_destroy(c);
	fake_kmod.present = false;
	c = create(GDR_BACKEND_AUTO);
	gdr_cache_backend(c, &be);
	assert_int_equal(be, GDR_BACKEND_DMABUF);
	gdr_cache_destroy(c);
	fake_cuda_set_device_attr(124 /* DMA_BUF_SUPPORTED */, 0);
	c = create(GDR_BACKEND_AUTO);
	gdr_cache_backend(c, &be);
	assert_int_equal(be, GDR_BACKEND_PEERMEM);
	gdr_cache_destroy(c);
	fake_cuda_set_device_attr(124, 1);
}

static void test_dmabuf(void **state)
{
	struct gdr_cache *c = create(GDR_BACKEND_DMABUF);
	uint64_t a = fake_cuda_alloc(4 * MiB), off;
	struct gdr_region *r, *r2;
	struct ibv_mr *mr;
	int fd;

	(void)state;
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)a, 4096, 1, &r), 0);
	assert_int_equal(gdr_region_dmabuf(r, &fd, &off), 0);
	assert_true(fd >= 0);
	assert_int_equal(off, 0);
	assert_int_equal(fake_cuda_open_dmabufs(), 1);
	assert_int_equal(fake_verbs.dmabuf_regs, 1);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_int_equal((uintptr_t)mr->addr, a);     /* iova = the pinned base */
	assert_int_equal(gdr_region_kmod(r, NULL, NULL, NULL), -ENOENT);
	assert_int_equal(gdr_dereg(r), 0);
	/* docs/FACTS.md, "dma-buf and freed memory": the dma-buf of a freed buffer keeps the old
	 * memory; the stale entry must go and its fd be closed. */
	fake_cuda_free(a);
	assert_int_equal(fake_cuda_alloc(4 * MiB), a);
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)a, 4096, 1, &r2), 0);
	assert_int_equal(fake_cuda_open_dmabufs(), 1);
	assert_int_equal(fake_verbs.outstanding, 1);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(gdr_cache_flush(c), 1);
	assert_int_equal(fake_cuda_open_dmabufs(), 0);
	/* Export failure is reported. */
	fake_cuda_fail_next("cuMemGetHandleForAddressRange", 2 /* OUT_OF_MEMORY */, 1);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 1, &r), -ENOMEM);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 1, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_cuda_open_dmabufs(), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	fake_cuda_free(a);
}

struct thread_arg {
	struct gdr_cache *c;
	uint64_t a;
	int rc;
};

static void *reg_from_thread(void *p)
{
	struct thread_arg *t = p;
	struct gdr_region *r;

	t->rc = gdr_reg(t->c, NULL, (void *)(uintptr_t)t->a, 4096, 0, &r);
	if (!t->rc)
		t->rc = gdr_dereg(r);
	return NULL;
}

/* docs/FACTS.md, "Threads without a context": a thread with no current context cannot export a
 * dma-buf; an MPI progress thread typically has none. The cache borrows the device's primary
 * context. */
static void test_dmabuf_thread_without_context(void **state)
{
	struct gdr_cache *c = create(GDR_BACKEND_DMABUF);
	struct thread_arg t = { .c = c, .a = fake_cuda_alloc(4 * MiB) };
	pthread_t th;
	void *cur = (void *)1;

	(void)state;
	fake_cuda_set_threads_have_context(false);
	pthread_create(&th, NULL, reg_from_thread, &t);
	pthread_join(th, NULL);
	assert_int_equal(t.rc, 0);
	assert_int_equal(fake_cuda_calls("cuDevicePrimaryCtxRetain"), 1);
	assert_int_equal(fake_cuda_open_dmabufs(), 1);
	fake_cuda_set_threads_have_context(true);
	(void)cur;
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_cuda_open_dmabufs(), 0);
	fake_cuda_free(t.a);
}

static void test_peermem(void **state)
{
	struct gdr_cache *c = create(GDR_BACKEND_PEERMEM);
	uint64_t a = fake_cuda_alloc(2 * MiB);
	struct gdr_region *r;
	struct ibv_mr *mr;

	(void)state;
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 4096, 0, &r), -EOPNOTSUPP);
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)a, 4096, 1, &r), 0);
	assert_int_equal(gdr_region_mr(r, &mr), 0);
	assert_int_equal(mr->length, 2 * MiB);
	assert_int_equal(fake_verbs.regs, 1);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	fake_cuda_free(a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_kmod, setup),
		cmocka_unit_test_setup(test_kmod_revocation, setup),
		cmocka_unit_test_setup(test_kmod_revocation_events, setup),
		cmocka_unit_test_setup(test_kmod_unavailable, setup),
		cmocka_unit_test_setup(test_auto_choice, setup),
		cmocka_unit_test_setup(test_dmabuf, setup),
		cmocka_unit_test_setup(test_dmabuf_thread_without_context, setup),
		cmocka_unit_test_setup(test_peermem, setup),
	};

	fake_kmod_install();
	fake_verbs_install();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
