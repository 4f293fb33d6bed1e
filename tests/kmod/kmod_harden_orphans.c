// SPDX-License-Identifier: MIT
/*
 * kmod_harden_test's subtests of issue 31, items 9-11 (VM case 26c):
 *
 *   orphan-lock   9: one owner's orphans are its own business. Owner A has an orphan and is inside
 *                 NVIDIA's put_pages for it (the simulator holds that put at a gate); another
 *                 process's GET_VERSION must complete meanwhile. The old module walked every
 *                 user's orphans under one global mutex on every ioctl and held that mutex across
 *                 put_pages, so the other call waited for A's put (with 16,384 orphans: seconds).
 *   owner-exit-shared  11: the owner pins (callback and persistent) and exits while a process
 *                 sharing its descriptor table (clone(CLONE_FILES)) lives on: every pin is given
 *                 back at the owner's exit. The old module waited for a close that never came.
 *   userns-caps   10: one user with four subordinate uids in a user namespace it created holds
 *                 max_user_pins pins in all, not max_user_pins per uid.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kmod_harden.h"

/* Read one byte from fd within ms; -1 on timeout or error. */
static int read_byte(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;

	if (poll(&p, 1, ms) != 1 || read(fd, &c, 1) != 1)
		return -1;
	return (unsigned char)c;
}

static void write_byte(int fd, int c)
{
	char b = (char)c;

	if (write(fd, &b, 1) != 1)
		_exit(120);
}

static void reap(pid_t pid)
{
	int status;

	if (pid <= 0)
		return;
	/* Every child here ends within seconds; SIGKILL bounds the wait. */
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
}

static int wait_gated(unsigned long long want, double secs)
{
	struct nvp2p_sim_stats s;
	double end = now() + secs;

	do {
		stats(&s);
		if (s.put_gated == want)
			return 1;
		usleep(10 * 1000);
	} while (now() < end);
	return 0;
}

/* ---- 9: another owner's orphans do not stall our ioctls ---------------------------------- */

void test_orphan_lock(void)
{
	int a_out[2], a_in[2], b_out[2], got, a_ret, b_ret = -1;
	struct nvp2p_sim_stats st;
	pid_t a, b = -1;

	if (pipe(a_out) || pipe(a_in) || pipe(b_out)) {
		kt_check(0, "pipes");
		return;
	}
	a = fork();
	if (a == 0) {
		struct gdrcache_version v;
		struct gdrcache_pin p;
		char *buf = kt_gpu_mem(KT_GPU_PAGE);
		int s = kt_sim_open(), fd = kt_gdr_open();
		uint64_t id;

		if (kt_sim_alloc(s, buf, KT_GPU_PAGE, &id) ||
		    kt_gdr_pin(fd, (uintptr_t)buf, KT_GPU_PAGE, 0, &p))
			_exit(1);
		kt_sim_fault(s, NVP2P_SIM_FAULT_PUT_ENOMEM, 1);
		if (kt_gdr_unpin(fd, p.handle))
			_exit(2);
		write_byte(a_out[1], 'o');		/* one orphan */
		if (read_byte(a_in[0], 20000) != 'g')
			_exit(3);
		/* Its retry puts the orphan: the simulator holds that put at the gate. */
		write_byte(a_out[1], kt_gdr_version(fd, &v) == 0 ? 'v' : 'x');
		_exit(0);
	}
	got = read_byte(a_out[0], 10000);
	kt_check(got == 'o', "owner A pinned and unpinned with put_pages failing");
	kt_check(param("gdrcache", "orphans") == 1, "A has one orphan (orphans = %lld)",
		 param("gdrcache", "orphans"));
	kt_sim_fault(sim, NVP2P_SIM_FAULT_PUT_GATE, 1);
	write_byte(a_in[1], 'g');
	if (!kt_check(wait_gated(1, 10), "A's next ioctl is inside put_pages for its orphan, held at "
		      "the simulator's gate"))
		goto out;

	b = fork();
	if (b == 0) {
		struct gdrcache_version v;
		int fd = open("/dev/gdrcache", O_RDWR | O_CLOEXEC);

		write_byte(b_out[1], fd >= 0 && kt_gdr_version(fd, &v) == 0 ? 'v' : 'x');
		_exit(0);
	}
	/* The deadline only bounds the old module's wait: there B can not finish before the gate. */
	b_ret = read_byte(b_out[0], 10000);
	stats(&st);
	kt_check(b_ret == 'v' && st.put_gated == 1,
		 "another process's GET_VERSION completed while A's put_pages was still held "
		 "(B %s, %llu put held)", b_ret == 'v' ? "done" : b_ret < 0 ? "still blocked after 10 s" :
		 "failed", (unsigned long long)st.put_gated);
out:
	kt_sim_fault(sim, NVP2P_SIM_FAULT_PUT_GATE, 0);
	a_ret = read_byte(a_out[0], 10000);
	if (b_ret < 0 && b > 0)
		b_ret = read_byte(b_out[0], 10000);
	kt_check(a_ret == 'v', "gate open: A's GET_VERSION returned 0");
	kt_check(wait_orphans(0, 2) && wait_sim(0, 0, 2), "A's orphan was given back");
	reap(a);
	reap(b);
}

/* ---- 11: the owner's exit, its descriptor table shared ----------------------------------- */

static int shared_owner(void *arg)
{
	int *w = arg, g, s;
	char *buf = kt_gpu_mem(2 * KT_GPU_PAGE);
	uint64_t id;

	s = kt_sim_open();
	g = kt_gdr_open();
	if (kt_sim_alloc(s, buf, 2 * KT_GPU_PAGE, &id) ||
	    kt_gdr_pin(g, (uintptr_t)buf, KT_GPU_PAGE, 0, NULL) ||
	    kt_gdr_pin(g, (uintptr_t)buf, 2 * KT_GPU_PAGE, 0, NULL) ||
	    kt_gdr_pin(g, (uintptr_t)buf, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, NULL))
		return 1;
	write_byte(*w, g);
	write_byte(*w, s);
	return 0;
}

void test_owner_exit_shared(void)
{
	static char stack[64 * 1024] __attribute__((aligned(16)));
	int p[2], status, g, s;
	pid_t pid;

	if (pipe(p)) {
		kt_check(0, "pipe");
		return;
	}
	pid = clone(shared_owner, stack + sizeof(stack), CLONE_FILES | SIGCHLD, &p[1]);
	if (!kt_check(pid > 0, "clone(CLONE_FILES) owner"))
		return;
	waitpid(pid, &status, 0);
	g = read_byte(p[0], 1000);
	s = read_byte(p[0], 1000);
	kt_check(WIFEXITED(status) && !WEXITSTATUS(status) && g > 0 && s > 0,
		 "the owner pinned 2 + 1 persistent and exited; its descriptors %d, %d live on in "
		 "our shared table", g, s);
	kt_check(wait_sim(0, 0, 2), "the owner's exit gave back every pin, though a process "
		 "sharing its descriptor table outlives it");
	kt_check(param("gdrcache", "pins") == 0 && param("gdrcache", "orphans") == 0,
		 "gdrcache: pins %lld, orphans %lld (want 0, 0)", param("gdrcache", "pins"),
		 param("gdrcache", "orphans"));
	if (g > 0)
		close(g);
	if (s > 0)
		close(s);	/* frees the allocation: callbacks end what the old module kept */
	kt_check(wait_sim(0, 0, 2) && wait_orphans(0, 2), "sim and module hold nothing");
	close(p[0]);
	close(p[1]);
}

/* ---- 10: caps and user namespaces -------------------------------------------------------- */

#define NS_UIDS 4
#define NS_BASE 200000	/* kernel uids NS_BASE.. are the namespace's 0..NS_UIDS-1 */

/* In the namespace, as its uid i: pin up to 3 pages and report how many worked; then hold. */
static void ns_pinner(int i, int w)
{
	char *buf = kt_gpu_mem(KT_GPU_PAGE);
	int s, fd, n = 0;
	uint64_t id;

	if (setresuid(i, i, i))
		_exit(101);
	s = open(NVP2P_SIM_DEVICE, O_RDWR);
	fd = open("/dev/gdrcache", O_RDWR);
	if (s < 0 || fd < 0 || kt_sim_alloc(s, buf, KT_GPU_PAGE, &id))
		_exit(102);
	while (n < 3 && kt_gdr_pin(fd, (uintptr_t)buf, KT_GPU_PAGE, 0, NULL) == 0)
		n++;
	write_byte(w, '0' + n);
	pause();
	_exit(0);
}

/* The namespace's creator: uid USER_A in the initial namespace, in the gdrcache group. */
static void ns_creator(int to_parent, int from_parent)
{
	gid_t g[1] = { TEST_GID };
	pid_t kids[NS_UIDS];
	int p[2], i, c, total = 0;

	if (setgroups(1, g) || setgid(TEST_GID) || setuid(USER_A))
		_exit(110);
	if (unshare(CLONE_NEWUSER)) {
		write_byte(to_parent, 'e');
		_exit(111);
	}
	write_byte(to_parent, 'u');
	if (read_byte(from_parent, 10000) != 'm' || pipe(p))
		_exit(112);
	for (i = 0; i < NS_UIDS; i++) {
		kids[i] = fork();
		if (kids[i] == 0)
			ns_pinner(i, p[1]);
	}
	for (i = 0; i < NS_UIDS; i++) {
		c = read_byte(p[0], 10000);
		if (c < '0' || c > '3')
			_exit(113);
		total += c - '0';
	}
	write_byte(to_parent, '0' + total);
	/* Hold until the parent has looked at the totals. */
	read_byte(from_parent, 10000);
	for (i = 0; i < NS_UIDS; i++)
		reap(kids[i]);
	_exit(0);
}

void test_userns_caps(void)
{
	long long saved = param("gdrcache", "max_user_pins");
	long long clone_ok = kt_read_num("/proc/sys/kernel/unprivileged_userns_clone");
	int up[2], down[2], c, status;
	char path[64], map[64];
	pid_t pid;

	if (saved <= 0 || pipe(up) || pipe(down)) {
		kt_check(0, "max_user_pins readable (%lld), pipes", saved);
		return;
	}
	/* Debian's switch for user namespaces made by users (absent upstream). */
	if (clone_ok == 0)
		kt_write_file("/proc/sys/kernel/unprivileged_userns_clone", "1");
	chown("/dev/gdrcache", 0, TEST_GID);
	set_param_ull("max_user_pins", 2);
	pid = fork();
	if (pid == 0)
		ns_creator(up[1], down[0]);
	c = read_byte(up[0], 10000);
	if (c != 'u') {
		printf("# SKIP uid %d can not create a user namespace here (%s)\n", USER_A,
		       c == 'e' ? "unshare(CLONE_NEWUSER) failed" : "no answer");
		reap(pid);
		set_param_ull("max_user_pins", saved);
		exit(KT_SKIP);
	}
	/* Root maps 4 kernel uids into uid USER_A's namespace, as newuidmap does with
	 * /etc/subuid. The namespace's owner stays USER_A. */
	snprintf(path, sizeof(path), "/proc/%d/uid_map", pid);
	snprintf(map, sizeof(map), "0 %d %d\n", NS_BASE, NS_UIDS);
	kt_check(kt_write_file(path, map) == 0, "uid_map '0 %d %d' of uid %d's namespace", NS_BASE,
		 NS_UIDS, USER_A);
	write_byte(down[1], 'm');
	c = read_byte(up[0], 20000);
	kt_check(c == '0' + 2, "4 uids of one user's namespace hold %d pins in all with "
		 "max_user_pins=2 (want 2: the caps are the namespace owner's)",
		 c >= '0' ? c - '0' : -1);
	write_byte(down[1], 'd');
	waitpid(pid, &status, 0);
	set_param_ull("max_user_pins", saved);
	chown("/dev/gdrcache", 0, 0);
	if (clone_ok == 0)
		kt_write_file("/proc/sys/kernel/unprivileged_userns_clone", "0");
	kt_check(wait_sim(0, 0, 2), "sim: nothing left");
	close(up[0]);
	close(up[1]);
	close(down[0]);
	close(down[1]);
}
