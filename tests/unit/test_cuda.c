/* SPDX-License-Identifier: MIT */
/* The CUDA driver concern: one-query classification, BUFFER_ID lookups, SYNC_MEMOPS outcomes, an
 * older driver without cuCtxSetFlags, and a driver whose cuInit fails. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda/cuda.h"
#include "cuda/cuda_abi.h"
#include "intercept/hooks.h"
#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"

#define MiB (1024ULL * 1024)

static void test_classify(void **state)
{
	uint64_t a = fake_cuda_alloc(3 * MiB), m = fake_cuda_alloc_managed(MiB);
	void *h = fake_cuda_alloc_host(4096);
	char *plain = malloc(64);
	struct gdr_ptr_info pi;
	uint64_t calls;

	(void)state;
	assert_int_equal(gdr_driver_load(), 0);
	calls = fake_cuda_calls("cuPointerGetAttributes");
	assert_int_equal(gdr_cuda_classify(a + 12345, &pi), 0);
	assert_int_equal(fake_cuda_calls("cuPointerGetAttributes") - calls, 1); /* one query */
	assert_int_equal(pi.mem_type, GDR_CU_MEMORYTYPE_DEVICE);
	assert_int_equal(pi.start, a);
	assert_int_equal(pi.size, 3 * MiB);
	assert_int_equal(pi.buffer_id, fake_cuda_buffer_id(a));
	assert_false(pi.managed);
	assert_int_equal(gdr_cuda_classify(m, &pi), 0);
	assert_true(pi.managed);
	assert_int_equal(gdr_cuda_classify((uintptr_t)h, &pi), 0);
	assert_int_equal(pi.mem_type, GDR_CU_MEMORYTYPE_HOST);
	assert_int_equal(gdr_cuda_classify((uintptr_t)plain, &pi), 0);
	assert_int_equal(pi.mem_type, 0);
	fake_cuda_free(a);
	assert_int_equal(gdr_cuda_classify(a, &pi), 0);
	assert_int_equal(pi.mem_type, 0);
	fake_cuda_free(m);
	fake_cuda_free_host(h);
	free(plain);
}

static void test_buffer_id_and_sync_memops(void **state)
{
	uint64_t a = fake_cuda_alloc(MiB), id, va = fake_cuda_vmm_reserve(4 * MiB);

	(void)state;
	assert_int_equal(gdr_cuda_buffer_id(a + 100, &id), 0);
	assert_int_equal(id, fake_cuda_buffer_id(a));
	assert_int_equal(gdr_cuda_set_sync_memops(a), 0);
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	/* docs/FACTS.md, "VMM memory": */
	assert_int_equal(gdr_cuda_set_sync_memops(va), -EOPNOTSUPP);
	fake_cuda_free(a);
	assert_int_equal(gdr_cuda_buffer_id(a, &id), -ESTALE);
	assert_int_equal(gdr_cuda_set_sync_memops(a), -EIO);
	fake_cuda_vmm_unmap(va, 2 * MiB);
	fake_cuda_vmm_free(va, 4 * MiB);
}

static void test_vmm_without_cuCtxSetFlags(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	struct gdr_cache_stats s;
	uint64_t va = fake_cuda_vmm_reserve(4 * MiB);

	(void)state;
	assert_int_equal(gdr_cuda_ctx_sync_memops(0), -EOPNOTSUPP); /* hidden in main() */
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(fake_cuda_vmm_map(va, 2 * MiB), 0);
	assert_int_equal(fake_cuda_vmm_map(va + 2 * MiB, 2 * MiB), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)va, 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)(va + 2 * MiB), 4096, 0, &r), 0);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)va, 4096, 0, &r), 0); /* hit */
	assert_int_equal(gdr_dereg(r), 0);
	gdr_cache_get_stats(c, &s);
	assert_int_equal(s.sync_memops_unavailable, 2); /* counted per allocation, once each */
	assert_int_equal(s.sync_memops_ctx, 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_vmm_unmap(va, 4 * MiB);
	fake_cuda_vmm_free(va, 4 * MiB);
}

/* Runs this program again in mode under an alarm (30 s times GDR_TEST_WAIT_SCALE: a hang fails);
 * skips where it cannot exec itself (qemu-user without binfmt_misc); its exit status. */
static int run_mode(const char *mode)
{
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale();
	pid_t pid = fork();
	int status;

	if (!pid) {
		alarm(alarm_s); /* kept across exec */
		execl("/proc/self/exe", "test_cuda", mode, (char *)NULL);
		_exit(77);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
		fail_msg("%s: hung (killed by its alarm after %u s)", mode, alarm_s);
	assert_true(WIFEXITED(status));
	if (WEXITSTATUS(status) == 77)
		skip();
	return WEXITSTATUS(status);
}

static void test_init_failure(void **state)
{
	(void)state;
	assert_int_equal(run_mode("--init-error"), 0);
}

/* A driver older than 11.3 (the README's minimum): GPU paths off, said once, host memory works. */
static void test_old_driver_refused(void **state)
{
	(void)state;
	assert_int_equal(run_mode("--old-driver"), 0);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_classify),
		cmocka_unit_test(test_buffer_id_and_sync_memops),
		cmocka_unit_test(test_vmm_without_cuCtxSetFlags),
		cmocka_unit_test(test_init_failure),
		cmocka_unit_test(test_old_driver_refused),
	};

	if (argc > 1 && !strcmp(argv[1], "--init-error")) {
		struct gdr_cache *c;
		char buf[64];
		struct gdr_region *r;

		fake_verbs_install();
		fake_cuda_set_init_error(GDR_CUDA_ERROR_NO_DEVICE);
		/* No usable driver: GPU paths off, the cache still works for host memory. */
		if (gdr_driver_load() != -ENODEV || fake_cache_create(NULL, NULL, &c))
			return 1;
		if (gdr_reg(c, FAKE_PD, buf, sizeof(buf), 0, &r) || gdr_dereg(r))
			return 2;
		return gdr_cache_destroy(c) ? 3 : 0;
	}
	if (argc > 1 && !strcmp(argv[1], "--old-driver")) {
		struct gdr_cache *c;
		struct gdr_region *r;
		uint64_t va;

		fake_verbs_install();
		fake_cuda_set_driver_version(11020); /* 11.2: cuGetProcAddress answers, too old */
		va = fake_cuda_alloc(4096);
		if (gdr_driver_load() != -ENODEV || fake_cache_create(NULL, NULL, &c))
			return 1;
		/* GPU memory is not known for what it is: with no PD, nothing to register */
		if (gdr_reg(c, NULL, (void *)(uintptr_t)va, 4096, 0, &r) != -ENODEV)
			return 2;
		return gdr_cache_destroy(c) ? 3 : 0;
	}
	fake_cuda_hide_symbol("cuCtxSetFlags");
	fake_verbs_install();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
