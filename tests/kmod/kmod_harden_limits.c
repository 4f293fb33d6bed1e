// SPDX-License-Identifier: MIT
/*
 * kmod_harden_test's subtests of limits (VM case 24): huge PIN lengths as root and as nobody
 * (issue 10 #9), kernel memory charged to the memory cgroup (#13), /dev/gdrcache 0660, per-user
 * and global caps (#15).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kmod_harden.h"

/* ---- 9: PIN lengths --------------------------------------------------------------------- */

static int huge_pins(void *arg)
{
	static const unsigned long long lens[] = {
		1ULL << 45, (1ULL << 40) + KT_GPU_PAGE, 1ULL << 47, 0xffffffff0000ULL,
	};
	char *buf = kt_gpu_mem(KT_GPU_PAGE);
	int fd = open("/dev/gdrcache", O_RDWR), bad = 0;
	size_t i;

	if (fd < 0)
		return 99;
	for (i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		int ret = kt_gdr_pin(fd, (uintptr_t)buf, lens[i], 0, NULL);

		if (ret != -EINVAL && ret != -EDQUOT && ret != -ENOSPC) {
			printf("# PIN len 0x%llx: %s\n", lens[i], strerror(-ret));
			bad++;
		}
	}
	close(fd);
	return bad;
}

void test_len(void)
{
	unsigned long long t0 = kt_taint();
	struct nvp2p_sim_stats s0;
	int ret;

	stats(&s0);
	if (chown("/dev/gdrcache", 0, TEST_GID))
		kt_diag("chown /dev/gdrcache: %s", strerror(errno));
	kt_expect(huge_pins(NULL), 0, "root: PIN of 32 TiB, 1 TiB + 64 KiB, 128 TiB, 2^32 - 1 pages: refused");
	ret = as_user(65534, TEST_GID, huge_pins, NULL);
	kt_expect(ret, 0, "nobody: the same refused");
	kt_check(kt_taint() == t0, "kernel not tainted (taint %llu -> %llu)", t0, kt_taint());
	kt_check(wait_sim(s0.outstanding_pins, s0.outstanding_persistent, 1), "sim: no pin made");
	chown("/dev/gdrcache", 0, 0);
}

/* ---- 13: memory cgroup ---------------------------------------------------------------------- */

static long long cg_read(const char *file)
{
	char path[128];

	snprintf(path, sizeof(path), "/sys/fs/cgroup/gdrtest/%s", file);
	return kt_read_num(path);
}
void test_memcg(void)
{
	enum { NFILES = 64, NPINS = 64 };
	char pid[32], *buf;
	int fds[NFILES], i, fd;
	long long before, after;
	uint64_t id, h[NPINS];
	struct gdrcache_pin p;

	mkdir("/sys/fs/cgroup/gdrtest", 0755);
	kt_write_file("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
	snprintf(pid, sizeof(pid), "%d", getpid());
	if (kt_write_file("/sys/fs/cgroup/gdrtest/cgroup.procs", pid) || cg_read("memory.current") < 0) {
		kt_skip("no cgroup2 memory controller at /sys/fs/cgroup");
		return;
	}
	before = cg_read("memory.current");
	for (i = 0; i < NFILES; i++)
		fds[i] = kt_gdr_open();
	after = cg_read("memory.current");
	kt_check(after - before >= NFILES * 64 * 1024LL,
		 "%d open files charged %lld KiB to the memcg (>= 64 KiB each)", NFILES,
		 (after - before) / 1024);
	for (i = 0; i < NFILES; i++)
		close(fds[i]);

	/* 64 pins of 256 MiB: 64 page arrays of 32 KiB. */
	buf = kt_gpu_mem(256 << 20);
	fd = kt_gdr_open();
	kt_sim_alloc(sim, buf, 256 << 20, &id);
	before = cg_read("memory.current");
	for (i = 0; i < NPINS; i++) {
		h[i] = 0;
		if (!kt_gdr_pin(fd, (uintptr_t)buf, 256 << 20, 0, &p))
			h[i] = p.handle;
	}
	after = cg_read("memory.current");
	kt_check(after - before >= NPINS * 24 * 1024LL,
		 "%d pins of 4096 pages charged %lld KiB (>= 24 KiB each)", NPINS,
		 (after - before) / 1024);
	for (i = 0; i < NPINS; i++)
		kt_gdr_unpin(fd, h[i]);
	close(fd);
	kt_sim_free(sim, id);
	kt_gpu_mem_free(buf, 256 << 20);
	kt_write_file("/sys/fs/cgroup/cgroup.procs", pid);
	rmdir("/sys/fs/cgroup/gdrtest");
}

/* ---- 15: access control and caps ---------------------------------------------------------- */

static int try_open(void *arg)
{
	int fd = open("/dev/gdrcache", O_RDWR);

	if (fd < 0)
		return errno;
	close(fd);
	return 0;
}

/* Child under a test uid: pin *n single pages, report how many worked and the last error. */
struct cap_job {
	int n, ok, err;
};

static int cap_pins(void *arg)
{
	struct cap_job *j = arg;
	char *buf = kt_gpu_mem(4 * KT_GPU_PAGE);
	int s = open(NVP2P_SIM_DEVICE, O_RDWR), fd = open("/dev/gdrcache", O_RDWR), i, ret;
	uint64_t id;

	if (s < 0 || fd < 0 || kt_sim_alloc(s, buf, 4 * KT_GPU_PAGE, &id))
		return 99;
	for (i = 0; i < j->n; i++) {
		ret = kt_gdr_pin(fd, (uintptr_t)buf, KT_GPU_PAGE, 0, NULL);
		if (ret)
			return 50 + (ret == -EDQUOT ? 1 : ret == -ENOSPC ? 2 : 3) * 10 + i;
	}
	return i;
}

/* A child that pins n pages and holds them until killed; returns its pid. */
static pid_t holder(uid_t uid, int n)
{
	int p[2], status;
	char c = 0;
	pid_t pid;

	if (pipe(p))
		return -1;
	pid = fork();
	if (pid == 0) {
		gid_t g[1] = { TEST_GID };
		struct cap_job j = { .n = n };

		close(p[0]);
		if (setgroups(1, g) || setgid(TEST_GID) || setuid(uid))
			_exit(100);
		c = cap_pins(&j) == n ? 'y' : 'n';
		if (write(p[1], &c, 1) != 1)
			_exit(1);
		pause();
		_exit(0);
	}
	close(p[1]);
	if (read(p[0], &c, 1) != 1 || c != 'y') {
		kt_diag("holder uid %d of %d pins failed (%c)", uid, n, c);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		pid = -1;
	}
	close(p[0]);
	return pid;
}

void test_access(void)
{
	static const char *const caps[] = { "max_user_pins", "max_user_pinned_bytes",
					    "max_total_pins", "max_total_pinned_bytes" };
	long long saved[4];
	struct cap_job j;
	struct stat st = { 0 };
	pid_t a, b;
	int i, ret;

	if (stat("/dev/gdrcache", &st))
		st.st_mode = 0;
	kt_check((st.st_mode & 0777) == 0660, "/dev/gdrcache created 0660 (mode %o)",
		 st.st_mode & 0777);
	chown("/dev/gdrcache", 0, TEST_GID);
	kt_expect(as_user(USER_A, 0, try_open, NULL), EACCES, "uid %d outside the group: EACCES",
		  USER_A);
	kt_expect(as_user(USER_A, TEST_GID, try_open, NULL), 0, "uid %d in the group: opens", USER_A);

	for (i = 0; i < 4; i++) {
		saved[i] = param("gdrcache", caps[i]);
		kt_check(saved[i] > 0, "cap %s = %lld by default", caps[i], saved[i]);
	}
	if (saved[0] <= 0)
		return;

	/* Per user: 3 pins; another user is not affected. */
	set_param_ull("max_user_pins", 3);
	j.n = 4;
	ret = as_user(USER_A, TEST_GID, cap_pins, &j);
	kt_expect(ret, 50 + 10 + 3, "uid %d: 3 pins, the 4th EDQUOT (max_user_pins=3)", USER_A);
	a = holder(USER_A, 3);
	b = holder(USER_B, 2);
	kt_check(a > 0 && b > 0, "uid %d holds 3 pins while uid %d holds 2", USER_A, USER_B);
	/* Global: 5 are held; a cap of 6 lets one more through. */
	set_param_ull("max_user_pins", saved[0]);
	set_param_ull("max_total_pins", 6);
	j.n = 2;
	ret = as_user(USER_B, TEST_GID, cap_pins, &j);
	kt_expect(ret, 50 + 20 + 1, "uid %d: 1 more pin, then ENOSPC (max_total_pins=6)", USER_B);
	for (i = 0; i < 2; i++) {
		pid_t h = i ? b : a;

		if (h > 0) {
			kill(h, SIGKILL);
			waitpid(h, NULL, 0);
		}
	}
	set_param_ull("max_total_pins", saved[2]);

	/* Bytes: 128 KiB per user. */
	set_param_ull("max_user_pinned_bytes", 2 * KT_GPU_PAGE);
	j.n = 3;
	ret = as_user(USER_A, TEST_GID, cap_pins, &j);
	kt_expect(ret, 50 + 10 + 2, "uid %d: 2 pins of 64 KiB, the 3rd EDQUOT (128 KiB)", USER_A);
	set_param_ull("max_user_pinned_bytes", saved[1]);
	set_param_ull("max_total_pinned_bytes", 3 * KT_GPU_PAGE);
	j.n = 4;
	ret = as_user(USER_A, TEST_GID, cap_pins, &j);
	kt_expect(ret, 50 + 20 + 3, "uid %d: 3 pins, the 4th ENOSPC (max_total_pinned_bytes)",
		  USER_A);
	set_param_ull("max_total_pinned_bytes", saved[3]);
	chown("/dev/gdrcache", 0, 0);
	kt_check(wait_sim(0, 0, 2), "sim: nothing left");
}
