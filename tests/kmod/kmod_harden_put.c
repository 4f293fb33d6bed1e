// SPDX-License-Identifier: MIT
/*
 * kmod_harden_test's subtests of the provider's put and get failing (VM cases 25 and 28):
 * put_pages fails (issue 10 #10: orphans, their callback, retries, no unload), a callback-mode
 * orphan is put again only from its owner's process, and every code NVIDIA's get_pages returns
 * reaches PIN as a clear errno (issue 15).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kmod_harden.h"

/* ---- 10: put_pages fails ------------------------------------------------------------------ */

static int delete_module(const char *name)
{
	return syscall(SYS_delete_module, name, O_NONBLOCK) ? -errno : 0;
}

void test_put_fail(void)
{
	const volatile struct gdrcache_revoke_area *area;
	struct gdrcache_pin p1, p2, p3;
	struct gdrcache_version v;
	char *b1 = kt_gpu_mem(KT_GPU_PAGE), *b2 = kt_gpu_mem(KT_GPU_PAGE);
	char *b3 = kt_gpu_mem(KT_GPU_PAGE);
	uint64_t id1, id2, id3, pages[1];
	int fd = kt_gdr_open(), ret;
	void *m;

	kt_check(param("gdrcache", "orphans") == 0, "gdrcache reports orphans (0)");
	kt_gdr_version(fd, &v);
	m = mmap(NULL, v.revoke_area_size, PROT_READ, MAP_SHARED, fd, 0);
	area = m;
	kt_sim_alloc(sim, b1, KT_GPU_PAGE, &id1);
	kt_sim_alloc(sim, b2, KT_GPU_PAGE, &id2);
	kt_sim_alloc(sim, b3, KT_GPU_PAGE, &id3);

	/* a. One failure: the retry gives the page table back. */
	kt_expect(kt_gdr_pin(fd, (uintptr_t)b1, KT_GPU_PAGE, 0, &p1), 0, "PIN");
	kt_sim_fault(sim, NVP2P_SIM_FAULT_PUT_ENOMEM, 1);
	kt_expect(kt_gdr_unpin(fd, p1.handle), 0, "UNPIN, put_pages fails: still 0");
	kt_check(param("gdrcache", "orphans") == 1, "one orphan");
	/* Retried in the owner's context (its next call), never from a kworker. */
	kt_gdr_version(fd, &v);
	kt_check(wait_sim(0, 0, 5) && wait_orphans(0, 1),
		 "the owner's next call put it: sim and module hold nothing");

	/* b. The callback finishes an orphan, and touches no live pin. */
	kt_expect(kt_gdr_pin(fd, (uintptr_t)b2, KT_GPU_PAGE, 0, &p2), 0, "PIN b2");
	kt_sim_fault(sim, NVP2P_SIM_FAULT_PUT_ENOMEM, 1000000);
	kt_expect(kt_gdr_unpin(fd, p2.handle), 0, "UNPIN b2, put_pages keeps failing");
	kt_expect(kt_gdr_pin(fd, (uintptr_t)b3, KT_GPU_PAGE, 0, &p3), 0, "PIN b3 (a live pin)");
	kt_expect(kt_sim_free(sim, id2), 0, "FREE b2: the callback comes for the orphan");
	kt_check(wait_orphans(0, 2), "the callback finished the orphan");
	kt_check(m != MAP_FAILED && area->slot[GDRCACHE_HANDLE_SLOT(p3.handle)] != p3.handle,
		 "the live pin b3 is not shown revoked");
	kt_expect(kt_gdr_get_pages(fd, p3.handle, pages, 1, NULL), 0, "GET_PAGES b3: 0");
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	kt_check(wait_sim(1, 0, 1), "sim: only b3 pinned");
	kt_expect(kt_gdr_unpin(fd, p3.handle), 0, "UNPIN b3");

	/* c. A persistent pin whose put fails twice is retried until it is given back. */
	kt_expect(kt_gdr_pin(fd, (uintptr_t)b1, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, &p1), 0,
		  "PIN persistent");
	kt_sim_fault(sim, NVP2P_SIM_FAULT_PUT_ENOMEM, 2);
	kt_expect(kt_gdr_unpin(fd, p1.handle), 0, "UNPIN persistent, put fails");
	kt_check(param("gdrcache", "orphans") == 1, "persistent orphan counted");
	kt_check(wait_sim(0, 0, 8) && wait_orphans(0, 1), "retries gave it back");

	/* d. No unload while an orphan exists. */
	kt_sim_fault(sim, NVP2P_SIM_FAULT_PUT_ENOMEM, 1000000);
	kt_gdr_pin(fd, (uintptr_t)b1, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, NULL);
	kt_gdr_pin(fd, (uintptr_t)b3, KT_GPU_PAGE, 0, NULL);
	if (m != MAP_FAILED)
		munmap(m, v.revoke_area_size);
	close(fd);
	kt_check(param("gdrcache", "orphans") == 2, "close with put failing: 2 orphans");
	ret = delete_module("gdrcache");
	kt_check(ret != 0, "rmmod gdrcache with orphans refused (%s)", ret ? strerror(-ret) : "unloaded");
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	/* The worker retries the persistent one; the callback-mode one, whose
	 * owner has no file left to call on, waits for its callback. */
	kt_check(wait_sim(1, 0, 5) && wait_orphans(1, 1),
		 "fault cleared: the retry gave the persistent one back, the other waits");
	kt_expect(kt_sim_free(sim, id3), 0, "FREE b3: its callback finishes the last orphan");
	kt_check(wait_sim(0, 0, 1) && wait_orphans(0, 1), "nothing left");
	kt_sim_free(sim, id1);
}

/* ---- issue 15: NVIDIA's put_pages only works in the pinning process ----------------------- */

/*
 * NVIDIA's RmP2PPutPages() finds a callback-mode page table among the RM
 * clients of the calling pid; from any other context (a kworker, another
 * process) it finds nothing and nvidia_p2p_put_pages() returns 0 having
 * released nothing (the simulator does the same). A module that retried an
 * orphan from a workqueue would count it given back while NVIDIA still holds
 * it, free the region, and meet the free callback later with freed memory.
 */
void test_put_context(void)
{
	struct gdrcache_pin p;
	struct gdrcache_version v;
	char *b = kt_gpu_mem(KT_GPU_PAGE);
	long long foreign0 = param("nvp2p_sim", "put_foreign");
	uint64_t id;
	int fd = kt_gdr_open();

	kt_sim_alloc(sim, b, KT_GPU_PAGE, &id);
	kt_expect(kt_gdr_pin(fd, (uintptr_t)b, KT_GPU_PAGE, 0, &p), 0, "PIN");
	kt_sim_fault(sim, NVP2P_SIM_FAULT_PUT_ENOMEM, 1);
	kt_expect(kt_gdr_unpin(fd, p.handle), 0, "UNPIN, put_pages fails: an orphan");
	kt_check(param("gdrcache", "orphans") == 1, "one orphan");
	/* The old module retried every second from a kworker. */
	usleep(2500 * 1000);
	kt_check(param("nvp2p_sim", "put_foreign") == foreign0,
		 "no put_pages from another context (%lld, want %lld)",
		 param("nvp2p_sim", "put_foreign"), foreign0);
	kt_check(param("gdrcache", "orphans") == 1 && wait_sim(1, 0, 0),
		 "2.5 s later the orphan is still counted and still pinned at the provider");
	kt_gdr_version(fd, &v);
	kt_check(wait_sim(0, 0, 1) && wait_orphans(0, 1),
		 "the owner's next call gave it back: sim and module hold nothing");
	close(fd);
	kt_sim_free(sim, id);
	kt_gpu_mem_free(b, KT_GPU_PAGE);
}

/* ---- issue 15: every error NVIDIA's get_pages returns ------------------------------------ */

#define KT_ENOTSUPP 524	/* kernel-internal, what NVIDIA returns for NV_ERR_NOT_SUPPORTED */

void test_get_errors(void)
{
	static const int codes[] = { EINVAL, ENOMEM, EIO, KT_ENOTSUPP, EBUSY, ENODEV };
	struct gdrcache_pin p;
	char *b = kt_gpu_mem(KT_GPU_PAGE);
	long long total = param("gdrcache", "max_total_pins");
	char buf[32];
	uint64_t id;
	size_t i;
	int fd = kt_gdr_open(), persistent, want;

	kt_sim_alloc(sim, b, KT_GPU_PAGE, &id);
	/* One pin in all: a slot or charge left behind by a failure shows at once. */
	kt_check(kt_set_param("gdrcache", "max_total_pins", "1") == 0, "max_total_pins=1");
	for (persistent = 0; persistent < 2; persistent++) {
		for (i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
			uint32_t fl = persistent ? GDRCACHE_PIN_PERSISTENT : 0;

			want = codes[i] == KT_ENOTSUPP ? EOPNOTSUPP : codes[i];
			kt_expect(kt_sim_fault(sim, NVP2P_SIM_FAULT_GET_ERR, codes[i]), 0,
				  "inject %d", codes[i]);
			kt_expect(kt_gdr_pin(fd, (uintptr_t)b, KT_GPU_PAGE, fl, &p), -want,
				  "%s PIN, NVIDIA returns -%d: -%d (%s)",
				  persistent ? "persistent" : "callback", codes[i], want,
				  strerror(want));
			kt_check(wait_sim(0, 0, 0), "nothing pinned at the provider");
			kt_expect(kt_gdr_pin(fd, (uintptr_t)b, KT_GPU_PAGE, fl, &p), 0,
				  "the next PIN succeeds (slot and charge were given back)");
			kt_expect(kt_gdr_unpin(fd, p.handle), 0, "UNPIN");
		}
	}
	kt_check(param("gdrcache", "orphans") == 0, "no orphans");
	snprintf(buf, sizeof(buf), "%lld", total);
	kt_set_param("gdrcache", "max_total_pins", buf);
	close(fd);
	kt_sim_free(sim, id);
	kt_check(wait_sim(0, 0, 1), "sim: nothing left");
	kt_gpu_mem_free(b, KT_GPU_PAGE);
}
