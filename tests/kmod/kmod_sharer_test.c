// SPDX-License-Identifier: MIT
/*
 * kmod_sharer_test: the module against a process that shares the pinning process's descriptors.
 *
 *   foreign-release [uaf]
 *     The owner pins, then a process that shares its descriptor table (clone(CLONE_FILES), not a
 *     thread) closes the descriptor: the last fput runs gdr_release() in that process, whose
 *     gdr_file_end() calls nvidia_p2p_put_pages() from the wrong tgid. NVIDIA (and the sim) return
 *     0 and release nothing, the module frees the region anyway: the provider keeps the pin with
 *     the free callback armed on freed memory. With "uaf", FREE the allocation afterwards: the
 *     callback runs on the freed gdr_region (spin_lock + stores into freed slab memory).
 *     The owner first unmaps the page open() maps into it (the anchor, issue 31 #11), which
 *     otherwise keeps the file, and its pins, until the owner's exit.
 *   dofork
 *     MADV_DOFORK on the revocation area lets a forked child inherit it (VM_DONTCOPY undone).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kmod_test.h"

static int gdrfd;

static long long param(const char *module, const char *name)
{
	char path[160];

	snprintf(path, sizeof(path), "/sys/module/%s/parameters/%s", module, name);
	return kt_read_num(path);
}

static int child_close(void *arg)
{
	(void)arg;
	close(gdrfd);
	return 0;
}

static void foreign_release(int uaf)
{
	static char stack[64 * 1024] __attribute__((aligned(16)));
	struct nvp2p_sim_stats s;
	struct gdrcache_pin p;
	unsigned long long taint0 = kt_taint();
	size_t len = 4 * KT_GPU_PAGE;
	char *b = kt_gpu_mem(len);
	long long foreign0 = param("nvp2p_sim", "put_foreign");
	uint64_t id;
	int sim = kt_sim_open(), status;
	pid_t pid;

	kt_expect(kt_sim_alloc(sim, b, len, &id), 0, "sim ALLOC");
	gdrfd = kt_gdr_open();
	kt_expect(kt_gdr_pin(gdrfd, (uintptr_t)b, len, 0, &p), 0, "PIN by the owner");
	kt_sim_expect(sim, 1, 0, 1, "the provider holds the pin");
	kt_diag("the owner unmapped %d anchor(s)", kt_gdr_drop_anchors());
	kt_check(param("gdrcache", "pins") == 1, "gdrcache pins = 1");

	pid = clone(child_close, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL);
	kt_check(pid > 0, "clone(CLONE_FILES)");
	waitpid(pid, &status, 0);
	kt_check(fcntl(gdrfd, F_GETFD) < 0, "the descriptor is gone from the shared table");

	kt_sim_stats(sim, &s);
	kt_diag("after the sharer's close: gdrcache pins=%lld orphans=%lld; sim outstanding=%llu "
		"put_foreign=%lld (was %lld)", param("gdrcache", "pins"),
		param("gdrcache", "orphans"), (unsigned long long)s.outstanding_pins,
		param("nvp2p_sim", "put_foreign"), foreign0);
	/* What a correct module does: either the pin is given back, or it is kept (orphan) until
	 * the callback comes. Freeing the region while the provider still holds the pin is the bug. */
	kt_check(!(s.outstanding_pins == 1 && param("gdrcache", "pins") == 0 &&
		   param("gdrcache", "orphans") == 0),
		 "the module does not forget a pin the provider still holds (callback armed on "
		 "freed memory)");
	if (uaf) {
		kt_diag("FREE: the provider now calls gdr_free_callback(freed region)");
		kt_expect(kt_sim_free(sim, id), 0, "sim FREE");
		sleep(1);
		kt_check(kt_taint() == taint0, "kernel not tainted (was %#llx, now %#llx)", taint0,
			 kt_taint());
		kt_check(param("gdrcache", "pins") == 0 && param("gdrcache", "orphans") == 0,
			 "after the callback: gdrcache pins=%lld orphans=%lld (want 0, 0)",
			 param("gdrcache", "pins"), param("gdrcache", "orphans"));
	}
	kt_sim_stats(sim, &s);
	kt_diag("end: sim outstanding=%llu callbacks_fired=%llu", (unsigned long long)s.outstanding_pins,
		(unsigned long long)s.callbacks_fired);
}

static void dofork(void)
{
	struct gdrcache_version v;
	int fd = kt_gdr_open(), status;
	void *m;
	pid_t pid;

	kt_expect(kt_gdr_version(fd, &v), 0, "GET_VERSION");
	m = mmap(NULL, v.revoke_area_size, PROT_READ, MAP_SHARED, fd, 0);
	kt_check(m != MAP_FAILED, "mmap the area");
	if (madvise(m, v.revoke_area_size, MADV_DOFORK)) {
		/* What the fix does (VM_IO): MADV_DOFORK refused, VM_DONTCOPY stays. */
		kt_check(errno == EINVAL, "MADV_DOFORK refused (errno %d)", errno);
		close(fd);
		return;
	}
	kt_diag("MADV_DOFORK accepted: VM_DONTCOPY cleared");
	pid = fork();
	if (pid == 0) {
		/* nslots is at offset 8: a child that could read it inherited the mapping. */
		_exit(((volatile struct gdrcache_revoke_area *)m)->nslots == v.max_pins ? 0 : 1);
	}
	waitpid(pid, &status, 0);
	kt_check(!(WIFEXITED(status) && WEXITSTATUS(status) == 0),
		 "a forked child does not read its parent's revocation area (child %s)",
		 WIFEXITED(status) ? (WEXITSTATUS(status) ? "read garbage" : "read it") : "faulted");
	close(fd);
}

int main(int argc, char **argv)
{
	kt_require_devices();
	if (argc >= 2 && !strcmp(argv[1], "foreign-release"))
		foreign_release(argc >= 3 && !strcmp(argv[2], "uaf"));
	else if (argc >= 2 && !strcmp(argv[1], "dofork"))
		dofork();
	else {
		fprintf(stderr, "usage: %s foreign-release [uaf] | dofork\n", argv[0]);
		return 2;
	}
	return kt_done();
}
