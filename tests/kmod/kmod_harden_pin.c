// SPDX-License-Identifier: MIT
/*
 * kmod_harden_test's subtests of PIN against its own races (VM case 23): another thread UNPINs
 * the handle PIN is about to return (issue 10 #8); a free callback before PIN has read the page
 * table (#14); the callback calls nvidia_p2p_free_page_table where it may sleep; GET_PAGES
 * faulting on its user buffer holds no lock that UNPIN needs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kmod_harden.h"

/* ---- 8: use-after-free in PIN ------------------------------------------------------------ */

static int race_fd;
static uint32_t race_slot;
static _Atomic uint32_t race_gen;	/* last generation PIN returned for race_slot */
static atomic_int race_stop;
static atomic_long race_bad, race_stolen, race_pins;
static char *race_buf;

static void race_check(const struct gdrcache_pin *p, uint32_t want_pages)
{
	if (p->page_count != want_pages || GDRCACHE_HANDLE_SLOT(p->handle) != race_slot) {
		if (atomic_fetch_add(&race_bad, 1) < 5)
			kt_diag("PIN of %u pages returned handle 0x%llx, %u pages", want_pages,
				(unsigned long long)p->handle, p->page_count);
		return;
	}
	atomic_store(&race_gen, GDRCACHE_HANDLE_GEN(p->handle));
}

static void *race_pinner(void *arg)
{
	struct gdrcache_pin p;

	while (!atomic_load(&race_stop)) {
		if (kt_gdr_pin(race_fd, (uintptr_t)race_buf, KT_GPU_PAGE, 0, &p))
			continue;
		atomic_fetch_add(&race_pins, 1);
		race_check(&p, 1);
		kt_gdr_unpin(race_fd, p.handle);
	}
	return NULL;
}

/* Unpin the handle the pinner is about to get, and take its slot with a 2-page pin. */
static void *race_thief(void *arg)
{
	struct gdrcache_pin p;
	uint64_t h;

	while (!atomic_load(&race_stop)) {
		h = ((uint64_t)(atomic_load(&race_gen) + 1) << 32) | race_slot;
		if (kt_gdr_unpin(race_fd, h))
			continue;
		atomic_fetch_add(&race_stolen, 1);
		if (kt_gdr_pin(race_fd, (uintptr_t)race_buf, 2 * KT_GPU_PAGE, 0, &p))
			continue;
		race_check(&p, 2);
		kt_gdr_unpin(race_fd, p.handle);
	}
	return NULL;
}

void test_pin_race(void)
{
	struct gdrcache_version v;
	struct gdrcache_pin p;
	pthread_t t[4];
	uint64_t id, *fill;
	uint32_t n = 0, i;
	double end;

	race_fd = kt_gdr_open();
	kt_gdr_version(race_fd, &v);
	race_buf = kt_gpu_mem(2 * KT_GPU_PAGE);
	if (kt_sim_alloc(sim, race_buf, 2 * KT_GPU_PAGE, &id)) {
		kt_check(0, "nvp2p_sim ALLOC");
		return;
	}
	/* Every slot but one taken: every PIN gets that slot, its handle is predictable. */
	fill = calloc(v.max_pins, sizeof(*fill));
	while (n < v.max_pins - 1 &&
	       !kt_gdr_pin(race_fd, (uintptr_t)race_buf, KT_GPU_PAGE, 0, &p))
		fill[n++] = p.handle;
	kt_check(n == v.max_pins - 1, "%u of %u slots filled", n, v.max_pins);
	kt_expect(kt_gdr_pin(race_fd, (uintptr_t)race_buf, KT_GPU_PAGE, 0, &p), 0, "PIN the free slot");
	race_slot = GDRCACHE_HANDLE_SLOT(p.handle);
	atomic_store(&race_gen, GDRCACHE_HANDLE_GEN(p.handle));
	kt_gdr_unpin(race_fd, p.handle);

	pthread_create(&t[0], NULL, race_pinner, NULL);
	for (i = 1; i < 4; i++)
		pthread_create(&t[i], NULL, race_thief, NULL);
	end = now() + seconds;
	while (now() < end)
		usleep(50 * 1000);
	atomic_store(&race_stop, 1);
	for (i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	kt_diag("%ld PINs, %ld handles unpinned by another thread before PIN returned",
		atomic_load(&race_pins), atomic_load(&race_stolen));
	kt_check(atomic_load(&race_bad) == 0,
		 "PIN always returned its own handle and page count (%ld wrong)",
		 atomic_load(&race_bad));
	for (i = 0; i < n; i++)
		kt_gdr_unpin(race_fd, fill[i]);
	free(fill);
	close(race_fd);
	kt_sim_free(sim, id);
	kt_check(wait_sim(0, 0, 2), "sim: nothing left");
}

/* ---- 14: a callback between get_pages and reading the page table ------------------------ */

struct pin_job {
	int fd;
	char *buf;
	int ret;
	struct gdrcache_pin pin;
};

static void *pin_job_main(void *arg)
{
	struct pin_job *j = arg;

	j->ret = kt_gdr_pin(j->fd, (uintptr_t)j->buf, 2 * KT_GPU_PAGE, 0, &j->pin);
	return NULL;
}

void test_pin_revoke(void)
{
	struct gdrcache_event ev[8];
	struct gdrcache_version v;
	const volatile struct gdrcache_revoke_area *area;
	struct pin_job j = { 0 };
	uint64_t id, pages[2];
	pthread_t t;
	void *m;
	int round, n, i, ok_events = 1, ok_area = 1, ok_pin = 1, ok_pages = 1;

	j.fd = kt_gdr_open();
	kt_gdr_version(j.fd, &v);
	m = mmap(NULL, v.revoke_area_size, PROT_READ, MAP_SHARED, j.fd, 0);
	if (!kt_check(m != MAP_FAILED, "mmap the revocation area"))
		return;
	area = m;
	j.buf = kt_gpu_mem(2 * KT_GPU_PAGE);
	for (round = 0; round < 5; round++) {
		uint64_t before = area->revoke_count;

		kt_sim_alloc(sim, j.buf, 2 * KT_GPU_PAGE, &id);
		/* get_pages arms the callback, then sleeps 300 ms before returning. */
		kt_sim_fault(sim, NVP2P_SIM_FAULT_GET_DELAY, 300 * 1000);
		pthread_create(&t, NULL, pin_job_main, &j);
		usleep(100 * 1000);
		kt_sim_free(sim, id);	/* calls back while get_pages has not returned */
		pthread_join(t, NULL);
		kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);

		if (j.ret) {
			kt_diag("round %d: PIN failed: %s", round, strerror(-j.ret));
			ok_pin = 0;
		}
		n = kt_read_events(j.fd, ev, 8);
		/* Exactly one event, for the handle PIN returned, and the area agrees. */
		if (n < 0)
			n = 0;
		for (i = 0; i < n; i++)
			if (ev[i].type != GDRCACHE_EVENT_REVOKED || j.ret || ev[i].handle != j.pin.handle) {
				kt_diag("round %d: event for handle 0x%llx (PIN %s 0x%llx)", round,
					(unsigned long long)ev[i].handle, j.ret ? "failed;" : "returned",
					(unsigned long long)j.pin.handle);
				ok_events = 0;
			}
		if (!j.ret && n != 1)
			ok_events = 0;
		if (!j.ret && (area->revoke_count != before + 1 ||
			       area->slot[GDRCACHE_HANDLE_SLOT(j.pin.handle)] != j.pin.handle))
			ok_area = 0;
		if (!j.ret) {
			if (kt_gdr_get_pages(j.fd, j.pin.handle, pages, 2, NULL) != -EIO)
				ok_pages = 0;
			if (kt_gdr_unpin(j.fd, j.pin.handle))
				ok_pages = 0;
		}
	}
	kt_check(ok_pin, "PIN succeeds though the memory was freed before it returned");
	kt_check(ok_events, "one REVOKED event per round, for the handle PIN returned");
	kt_check(ok_area, "the area shows that handle revoked");
	kt_check(ok_pages, "GET_PAGES on it: EIO; UNPIN: 0");
	munmap(m, v.revoke_area_size);
	close(j.fd);
	kt_check(wait_sim(0, 0, 2), "sim: nothing left");
}

/* ---- suspected: nvidia_p2p_free_page_table under a spinlock ------------------------------ */

void test_free_table(void)
{
	long long before = param("nvp2p_sim", "free_table_atomic");
	struct gdrcache_pin p;
	char *buf = kt_gpu_mem(KT_GPU_PAGE);
	uint64_t id;
	int fd = kt_gdr_open(), i;

	if (!kt_check(before >= 0, "nvp2p_sim counts free_table_atomic"))
		return;
	for (i = 0; i < 20; i++) {
		kt_sim_alloc(sim, buf, KT_GPU_PAGE, &id);
		kt_gdr_pin(fd, (uintptr_t)buf, KT_GPU_PAGE, 0, &p);
		kt_sim_free(sim, id);
		kt_gdr_unpin(fd, p.handle);
	}
	kt_check(param("nvp2p_sim", "free_table_atomic") == before,
		 "20 callbacks, nvidia_p2p_free_page_table never called with IRQs or preemption off "
		 "(%lld times)", param("nvp2p_sim", "free_table_atomic") - before);
	close(fd);
}

/* ---- suspected: GET_PAGES holding the file lock across copy_to_user ----------------------- */

struct gp_job {
	int fd;
	uint64_t handle;
	void *dst;
	atomic_int done;
	int ret;
};

static void *gp_get_pages(void *arg)
{
	struct gp_job *j = arg;

	j->ret = kt_gdr_get_pages(j->fd, j->handle, j->dst, 1, NULL);
	atomic_store(&j->done, 1);
	return NULL;
}

static void *gp_unpin(void *arg)
{
	struct gp_job *j = arg;

	j->ret = kt_gdr_unpin(j->fd, j->handle);
	atomic_store(&j->done, 1);
	return NULL;
}

void test_get_pages_fault(void)
{
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { 0 };
	struct uffdio_zeropage zp = { 0 };
	struct gp_job a = { 0 }, b = { 0 };
	struct gdrcache_pin p1, p2;
	pthread_t ta, tb;
	char *buf = kt_gpu_mem(2 * KT_GPU_PAGE);
	void *page;
	uint64_t id;
	double t;
	int uffd, fd = kt_gdr_open();

	uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (uffd < 0 || ioctl(uffd, UFFDIO_API, &api)) {
		kt_skip("userfaultfd: %s", strerror(errno));
		return;
	}
	page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	reg.range.start = (uintptr_t)page;
	reg.range.len = 4096;
	reg.mode = UFFDIO_REGISTER_MODE_MISSING;
	if (ioctl(uffd, UFFDIO_REGISTER, &reg)) {
		kt_skip("UFFDIO_REGISTER: %s", strerror(errno));
		return;
	}
	kt_sim_alloc(sim, buf, 2 * KT_GPU_PAGE, &id);
	kt_gdr_pin(fd, (uintptr_t)buf, KT_GPU_PAGE, 0, &p1);
	kt_gdr_pin(fd, (uintptr_t)buf, 2 * KT_GPU_PAGE, 0, &p2);
	a.fd = b.fd = fd;
	a.handle = p1.handle;
	a.dst = page;
	b.handle = p2.handle;
	pthread_create(&ta, NULL, gp_get_pages, &a);
	usleep(200 * 1000);
	kt_check(!atomic_load(&a.done), "GET_PAGES is stuck faulting on its user buffer");
	t = now();
	pthread_create(&tb, NULL, gp_unpin, &b);
	while (!atomic_load(&b.done) && now() < t + 2)
		usleep(10 * 1000);
	kt_check(atomic_load(&b.done) && b.ret == 0,
		 "meanwhile UNPIN of another handle returns (%.2f s)", now() - t);
	zp.range.start = (uintptr_t)page;
	zp.range.len = 4096;
	ioctl(uffd, UFFDIO_ZEROPAGE, &zp);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	kt_expect(a.ret, 0, "GET_PAGES completes once the fault is resolved");
	kt_gdr_unpin(fd, p1.handle);
	close(fd);
	close(uffd);
	kt_sim_free(sim, id);
	kt_check(wait_sim(0, 0, 1), "sim: nothing left");
}
