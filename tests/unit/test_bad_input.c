/* SPDX-License-Identifier: MIT */
/* Bad input from an unprivileged caller: refused with -errno, never a crash, a leak, a stale
 * registration or a pin lost track of. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "deadline.h"
#include "fake_cuda.h"
#include "fakes.h"
#include "common/config.h"
#include "common/log.h"

#define MiB (1024ULL * 1024)

static void *dereg_thread(void *arg)
{
	return (void *)(intptr_t)gdr_dereg(arg);
}

static int dereg_on_other_thread(struct gdr_region *r)
{
	pthread_t th;
	void *rc;

	assert_int_equal(pthread_create(&th, NULL, dereg_thread, r), 0);
	assert_int_equal(pthread_join(th, &rc), 0);
	return (int)(intptr_t)rc;
}

/* A registration released on another thread (legitimate), then released again by the thread that
 * took it: the header says a release that would make releases exceed registrations, summed over
 * threads, is refused. If it is accepted, the record's holds go to -1, and the next registration
 * of the buffer is counted as no hold: a flush unpins it under its holder, and destroy succeeds. */
static void test_cross_thread_double_dereg(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r, *r2;
	uint64_t a = fake_cuda_alloc(2 * MiB);

	(void)state;
	fake_backend_reset();
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
	assert_int_equal(dereg_on_other_thread(r), 0); /* the one legitimate release */
	assert_int_equal(gdr_dereg(r), -EINVAL);       /* a second release: must be refused */
	/* Whatever the answer above, a new registration must be held. */
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r2), 0);
	assert_int_equal(gdr_cache_flush(c), 0); /* held: nothing to drop */
	assert_true(fake_backend_pin_current(r2, a, 64));
	assert_int_equal(gdr_cache_destroy(c), -EBUSY);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_be.outstanding, 0);
	fake_cuda_free(a);
}

/* The consequence of the release above being accepted: a holder's registration counted as none. */
static void test_cross_thread_double_dereg_keeps_holds(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r, *r2;
	uint64_t a = fake_cuda_alloc(2 * MiB);

	(void)state;
	fake_backend_reset();
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
	assert_int_equal(dereg_on_other_thread(r), 0);
	(void)gdr_dereg(r); /* bad input: the answer is test_cross_thread_double_dereg's concern */
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r2), 0);
	assert_int_equal(gdr_cache_flush(c), 0); /* r2 is held: nothing may be unpinned */
	assert_int_equal(fake_be.unpins, 0);
	assert_true(fake_backend_pin_current(r2, a, 64));
	assert_int_equal(gdr_cache_destroy(c), -EBUSY);
	assert_int_equal(gdr_dereg(r2), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_be.outstanding, 0);
	fake_cuda_free(a);
}

/* stderr to a file while the library logs; captured_lines: the library's lines since. */
static FILE *cap;
static int saved_stderr = -1;

static void capture(void)
{
	fflush(stderr);
	cap = tmpfile();
	assert_non_null(cap);
	saved_stderr = dup(2);
	dup2(fileno(cap), 2);
}

static int captured_lines(void)
{
	char line[1024];
	int n = 0;

	fflush(stderr);
	dup2(saved_stderr, 2);
	close(saved_stderr);
	rewind(cap);
	while (fgets(line, sizeof(line), cap))
		n += !strncmp(line, "gdrcache[", 9);
	fclose(cap);
	return n;
}

/* Every refusal of bad input says why in the log (gdrcache.h: "Bad input is refused with the error
 * named in its comment and a log line"). One call each: far below the per-site burst. */
static void test_refusals_are_logged(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	uint64_t a = fake_cuda_alloc(2 * MiB);
	enum gdr_backend be;
	struct {
		const char *what;
		int rc, lines;
	} got[8];
	int n = 0;

	(void)state;
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
#define TRY(call)                                                                                  \
	do {                                                                                       \
		capture();                                                                         \
		got[n].rc = (call);                                                                \
		got[n].lines = captured_lines();                                                   \
		got[n++].what = #call;                                                             \
	} while (0)
	TRY(gdr_cache_backend(NULL, &be));
	TRY(gdr_cache_backend(c, NULL));
	TRY(gdr_cache_flush(NULL));
	TRY(gdr_region_mr(r, NULL));
	TRY(gdr_region_range(r, NULL, NULL));
	TRY(gdr_region_buffer_id(r, NULL));
	TRY(gdr_region_mem_kind(r, NULL));
	TRY(gdr_region_pages(r, NULL, 4));
#undef TRY
	for (int i = 0; i < n; i++)
		print_message("%-40s rc %d, log lines %d\n", got[i].what, got[i].rc, got[i].lines);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
	for (int i = 0; i < n; i++) {
		assert_int_equal(got[i].rc, -EINVAL);
		assert_int_equal(got[i].lines, 1);
	}
}

/* A flood of bad calls prints a few lines, not one per call. */
static void test_bad_input_flood_is_rate_limited(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	struct ibv_mr *mr;
	struct gdr_cache_attr bad = { .field_mask = 1ULL << 40 };
	struct gdr_cache *none;
	uint64_t a = fake_cuda_alloc(2 * MiB);
	int lines;

	(void)state;
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	capture();
	for (int i = 0; i < 100000; i++) {
		assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 0, 0, &r), -EINVAL);
		assert_int_equal(gdr_dereg(NULL), -EINVAL);
		assert_int_equal(gdr_region_mr(NULL, &mr), -EINVAL);
		if (i % 16 == 0)
			assert_int_equal(gdr_cache_create(&bad, &none), -EINVAL);
	}
	lines = captured_lines();
	print_message("400k-ish bad calls: %d log lines\n", lines);
	assert_true(lines <= 4 * (GDR_LOG_BURST + 20));
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
}

static int count_dir(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* Caches made and destroyed in a loop, with and without registrations, leave no fd or thread. */
static void test_create_destroy_loop_leaks_nothing(void **state)
{
	uint64_t a = fake_cuda_alloc(2 * MiB);
	int fds, tasks;

	(void)state;
	fake_backend_reset();
	{ /* warm up: what is made once per process (libcuda, the interception) */
		struct gdr_cache *c;

		assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
		assert_int_equal(gdr_cache_destroy(c), 0);
	}
	fds = count_dir("/proc/self/fd");
	tasks = count_dir("/proc/self/task");
	for (int i = 0; i < 300; i++) {
		struct gdr_cache *c, *c2;
		struct gdr_region *r;
		struct gdr_cache_attr at = { .field_mask = GDR_CACHE_ATTR_MAX_BYTES |
							   GDR_CACHE_ATTR_MAX_ENTRIES |
							   GDR_CACHE_ATTR_MAX_PIN_BYTES,
					     .max_bytes = UINT64_MAX,
					     .max_entries = UINT64_MAX,
					     .max_pin_bytes = UINT64_MAX };

		assert_int_equal(fake_cache_create(i & 1 ? &at : NULL, &fake_backend_ops, &c), 0);
		assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c2), 0);
		assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
		assert_int_equal(gdr_reg(c2, NULL, (void *)(uintptr_t)a + 4096, 64, 0, &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
		assert_int_equal(gdr_cache_destroy(c2), 0);
		assert_int_equal(gdr_cache_destroy(c), -EBUSY);
		assert_int_equal(gdr_cache_flush(c), 0);
		/* r was c2's: c's registration is released by the record c handed out again */
		assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
		assert_int_equal(gdr_dereg(r), 0);
		assert_int_equal(gdr_cache_destroy(c), 0);
	}
	assert_int_equal(count_dir("/proc/self/fd"), fds);
	assert_int_equal(count_dir("/proc/self/task"), tasks);
	assert_int_equal(fake_be.outstanding, 0);
	fake_cuda_free(a);
}

/* gdr_dereg of a pointer into the middle of a held record: refused, and the hold stays. A record
 * is 64-byte aligned; a pointer that is not names no record. Here the forged pointer lands on an
 * exact record's start, the address the caller registered, chosen so that its low 32 bits read as
 * the record's "live" magic (0x6c697665); the bytes after it (the range's size) read as an entry. */
static void test_dereg_inside_record_refused(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r, *forged;
	uint64_t a = fake_cuda_alloc(6ULL << 30), x;

	(void)state;
	assert_true(a != 0);
	x = ((a + (1ULL << 32)) & ~0xffffffffULL) | 0x6c697665u; /* inside [a, a + 6 GiB) */
	assert_true(x >= a && x + 4096 <= a + (6ULL << 30));
	fake_backend_reset();
	fake_verbs_install();
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, FAKE_PD, (void *)(uintptr_t)x, 4096,
				 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &r),
			 0);
	forged = (struct gdr_region *)((char *)r + 24);
	assert_int_equal(gdr_dereg(forged), -EINVAL); /* never handed out */
	assert_int_equal(gdr_cache_flush(c), 0);      /* r is still held */
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_flush(c), 1);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(fake_be.outstanding, 0);
	assert_int_equal(fake_verbs.outstanding, 0);
	fake_cuda_free(a);
}

/* A misaligned pointer (4 bytes into a record) is refused with no undefined behaviour (the
 * sanitized build aborts on the misaligned member access). In a child: an abort is a failure. */
static void test_dereg_misaligned_refused(void **state)
{
	struct gdr_cache *c;
	struct gdr_region *r;
	uint64_t a = fake_cuda_alloc(2 * MiB);
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
	int st;
	pid_t pid;

	(void)state;
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		uint64_t b, l;
		enum gdr_mem_kind k;
		bool ok;

		alarm(alarm_s); /* a hang is a failure */
		ok = gdr_dereg((struct gdr_region *)((char *)r + 4)) == -EINVAL &&
		     gdr_region_range((struct gdr_region *)((char *)r + 4), &b, &l) == -EINVAL &&
		     gdr_region_mem_kind((struct gdr_region *)((char *)r + 12), &k) == -EINVAL;

		_exit(ok ? 0 : 1);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	fake_cuda_free(a);
	if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM)
		fail_msg("the child hung on a misaligned pointer (killed by its alarm after %u s)",
			 alarm_s);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

/* Where each pointer of test_dereg_foreign_pointer_refused points. */
enum foreign { FOREIGN_COPY, FOREIGN_ZERO, FOREIGN_UNMADE_SLOT, FOREIGN_DESTROYED, FOREIGN_N };
static const char *const foreign_name[FOREIGN_N] = {
	"a copy of a live record in the caller's memory",
	"zeroed caller memory",
	"a slot of a live cache's arena that no record was made in",
	"a record of a destroyed cache",
};

/* gdr_dereg and the accessors of 64-byte-aligned pointers gdr_reg never returned (issue 31 #3):
 * the header promises -EINVAL. The old gdr_dereg read the 32 MiB-aligned address below the pointer
 * (where a record's arena keeps its cache) before any check: SIGSEGV wherever nothing is mapped
 * there, as here, where the caller's page is alone in its 32 MiB. Each pointer in a child of its
 * own, with a deadline: a crash or a hang is a failure, named. */
static void test_dereg_foreign_pointer_refused(void **state)
{
	const size_t arena = 32 * MiB;
	struct gdr_cache *c;
	struct gdr_region *r;
	uint64_t a = fake_cuda_alloc(2 * MiB);
	unsigned alarm_s = 30 * (unsigned)gdr_deadline_scale(); /* GDR_TEST_WAIT_SCALE */
	char *res, *page;
	int st, bad = 0;

	(void)state;
	/* One page 1 MiB above a 32 MiB boundary, nothing else mapped in that 32 MiB. */
	res = mmap(NULL, 2 * arena, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	assert_true(res != MAP_FAILED);
	page = (char *)(((uintptr_t)res + arena - 1) & ~(uintptr_t)(arena - 1)) + MiB;
	assert_int_equal(munmap(res, 2 * arena), 0);
	assert_true(mmap(page, 4096, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == page);
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
	assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)a, 64, 0, &r), 0);
	for (int k = 0; k < FOREIGN_N; k++) {
		pid_t pid;

		fflush(NULL);
		pid = fork();
		assert_true(pid >= 0);
		if (!pid) {
			struct gdr_region *p = (struct gdr_region *)(void *)page;
			struct gdr_cache *c2;
			struct ibv_mr *mr;
			uint64_t b, l;
			bool ok;

			alarm(alarm_s); /* a hang is a failure */
			signal(SIGSEGV,
			       SIG_DFL); /* a crash is seen as one, not as cmocka's report */
			signal(SIGBUS, SIG_DFL);
			if (k == FOREIGN_COPY)
				memcpy(page, r, 64); /* "live" magic, an entry, a cache's fields */
			else if (k == FOREIGN_UNMADE_SLOT)
				/* 512 KiB on: beyond the records' made pages */
				p = (struct gdr_region *)((char *)r + 8192 * 64);
			if (k == FOREIGN_DESTROYED) {
				if (fake_cache_create(NULL, &fake_backend_ops, &c2) ||
				    gdr_reg(c2, NULL, (void *)(uintptr_t)a, 64, 0, &p) ||
				    gdr_dereg(p) || gdr_cache_destroy(c2))
					_exit(2);
			}
			ok = gdr_dereg(p) == -EINVAL && gdr_region_range(p, &b, &l) == -EINVAL &&
			     gdr_region_mr(p, &mr) == -EINVAL;
			_exit(ok ? 0 : 1);
		}
		assert_int_equal(waitpid(pid, &st, 0), pid);
		if (WIFSIGNALED(st))
			print_error("gdr_dereg of %s: killed by signal %d%s\n", foreign_name[k],
				    WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (a hang)" : "");
		else if (WEXITSTATUS(st))
			print_error("gdr_dereg of %s: not refused with -EINVAL (child exit %d)\n",
				    foreign_name[k], WEXITSTATUS(st));
		bad += st != 0;
	}
	assert_int_equal(gdr_dereg(r), 0);
	assert_int_equal(gdr_cache_destroy(c), 0);
	assert_int_equal(munmap(page, 4096), 0);
	fake_cuda_free(a);
	assert_int_equal(bad, 0);
}

struct loop_arg {
	struct gdr_cache *c;
	uint64_t a;
	int bad;
};

static void *reg_loop(void *p)
{
	struct loop_arg *la = p;

	for (int i = 0; i < 20000; i++) {
		struct gdr_region *r;

		if (gdr_reg(la->c, NULL, (void *)(uintptr_t)(la->a + (uint64_t)(i % 8) * 4096), 64,
			    0, &r) ||
		    gdr_dereg(r))
			la->bad++;
	}
	return NULL;
}

/* Caches made and destroyed while another thread registers on another cache. */
static void test_destroy_while_other_cache_busy(void **state)
{
	struct loop_arg la = { .a = fake_cuda_alloc(2 * MiB) };
	uint64_t b = fake_cuda_alloc(2 * MiB);
	pthread_t th;

	(void)state;
	fake_backend_reset();
	assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &la.c), 0);
	assert_int_equal(pthread_create(&th, NULL, reg_loop, &la), 0);
	for (int i = 0; i < 100; i++) {
		struct gdr_cache *c;
		struct gdr_region *r;

		assert_int_equal(fake_cache_create(NULL, &fake_backend_ops, &c), 0);
		assert_int_equal(gdr_reg(c, NULL, (void *)(uintptr_t)b, 64, 0, &r), 0);
		assert_int_equal(gdr_dereg(r), 0);
		assert_int_equal(gdr_cache_destroy(c), 0);
	}
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_equal(la.bad, 0);
	assert_int_equal(gdr_cache_destroy(la.c), 0);
	assert_int_equal(fake_be.outstanding, 0);
	fake_cuda_free(la.a);
	fake_cuda_free(b);
}

/* A size is digits and K, M, G or T (with i and/or B after it): an 'i' with no unit is malformed. */
static void test_size_bare_i_refused(void **state)
{
	uint64_t v = 7;

	(void)state;
	assert_int_equal(gdr_parse_size("4Ki", &v), 0);
	assert_int_equal(v, 4096);
	assert_int_equal(gdr_parse_size("4i", &v), -EINVAL);
	assert_int_equal(gdr_parse_size("4ib", &v), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cross_thread_double_dereg),
		cmocka_unit_test(test_cross_thread_double_dereg_keeps_holds),
		cmocka_unit_test(test_refusals_are_logged),
		cmocka_unit_test(test_bad_input_flood_is_rate_limited),
		cmocka_unit_test(test_create_destroy_loop_leaks_nothing),
		cmocka_unit_test(test_dereg_inside_record_refused),
		cmocka_unit_test(test_dereg_misaligned_refused),
		cmocka_unit_test(test_dereg_foreign_pointer_refused),
		cmocka_unit_test(test_size_bare_i_refused),
		cmocka_unit_test(test_destroy_while_other_cache_busy),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
