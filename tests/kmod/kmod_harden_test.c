// SPDX-License-Identifier: MIT
/*
 * kmod_harden_test: gdrcache.ko against an adversary (issue 10, items 8-15 and
 * the suspected defects), one subtest per argument, against the simulated
 * provider nvp2p_sim.ko. Runs as root inside the test VM (it drops to other
 * uids itself); TAP output.
 *
 *   pin-race      8: another thread UNPINs the handle PIN is about to return
 *   pin-revoke   14: a free callback between get_pages and reading the table
 *   free-table   the callback calls nvidia_p2p_free_page_table where it may sleep
 *   len           9: huge PIN lengths, as root and as nobody: no WARN, no huge
 *                 allocation
 *   put-fail     10: put_pages fails: orphans, their callback, retries, no unload
 *   put-context  issue 15: a callback-mode orphan is put again only from its
 *                owner's process (NVIDIA's put_pages from another process or a
 *                kworker returns 0 and releases nothing)
 *   get-errors   issue 15: every code NVIDIA's get_pages returns reaches PIN
 *                as a clear errno, with no slot, charge or pin left behind
 *   owner        11: SCM_RIGHTS, fork-inherited fd and mapping, close while mapped
 *   identity     12: a new process with the dead owner's pid (and mm address)
 *   memcg        13: per-file memory and page arrays are charged to the memcg
 *   access       15: 0660, unprivileged open, per-user and global caps
 *   get-pages-fault  GET_PAGES faulting on its user buffer blocks nobody else
 *   orphan-lock  issue 31 #9: another owner's orphans and their put_pages stall
 *                nobody else's ioctl
 *   owner-exit-shared  issue 31 #11: the owner's exit gives back every pin while
 *                a clone(CLONE_FILES) sibling keeps its descriptor table
 *   userns-caps  issue 31 #10: one user's subordinate uids share its caps
 *
 * Usage: kmod_harden_test SUBTEST [SECONDS]
 *
 * This file holds the helpers and main; the subtests are in kmod_harden_pin.c (pin-race,
 * pin-revoke, free-table, get-pages-fault), kmod_harden_limits.c (len, memcg, access),
 * kmod_harden_put.c (put-fail, put-context, get-errors), kmod_harden_owner.c (owner,
 * identity) and kmod_harden_orphans.c (orphan-lock, owner-exit-shared, userns-caps), declared in
 * kmod_harden.h.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kmod_harden.h"

int sim;
int seconds = 5;

double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* A module parameter as a number; -1 if it does not exist. */
long long param(const char *module, const char *name)
{
	char path[160];

	snprintf(path, sizeof(path), "/sys/module/%s/parameters/%s", module, name);
	return kt_read_num(path);
}

int set_param_ull(const char *name, unsigned long long v)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%llu", v);
	return kt_set_param("gdrcache", name, buf);
}

void stats(struct nvp2p_sim_stats *s)
{
	if (kt_sim_stats(sim, s)) {
		perror("nvp2p_sim GET_STATS");
		exit(2);
	}
}

/* Wait up to secs for the provider to hold exactly pins + persistent. */
int wait_sim(unsigned long long pins, unsigned long long persistent, double secs)
{
	struct nvp2p_sim_stats s;
	double end = now() + secs;

	do {
		stats(&s);
		if (s.outstanding_pins == pins && s.outstanding_persistent == persistent)
			return 1;
		usleep(20 * 1000);
	} while (now() < end);
	kt_diag("sim holds %llu callback pins, %llu persistent (want %llu, %llu)",
		(unsigned long long)s.outstanding_pins,
		(unsigned long long)s.outstanding_persistent, pins, persistent);
	return 0;
}

int wait_orphans(long long want, double secs)
{
	double end = now() + secs;
	long long v;

	do {
		v = param("gdrcache", "orphans");
		if (v == want)
			return 1;
		usleep(20 * 1000);
	} while (now() < end);
	kt_diag("gdrcache orphans = %lld (want %lld)", v, want);
	return 0;
}

/* Run fn() in a child under uid (and, if gid, with that supplementary group). */
int as_user(uid_t uid, gid_t gid, int (*fn)(void *), void *arg)
{
	int status;
	pid_t pid = fork();

	if (pid == 0) {
		gid_t groups[1] = { gid };

		if (setgroups(gid ? 1 : 0, groups) || setgid(gid ? gid : 65534) || setuid(uid))
			_exit(100);
		_exit(fn(arg));
	}
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int send_fds(int sock, const int *fds, int n)
{
	char cbuf[CMSG_SPACE(4 * sizeof(int))] = { 0 };
	struct iovec iov = { .iov_base = "f", .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = CMSG_SPACE(n * sizeof(int)) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);

	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(n * sizeof(int));
	memcpy(CMSG_DATA(c), fds, n * sizeof(int));
	return sendmsg(sock, &m, 0) == 1 ? 0 : -1;
}

int recv_fds(int sock, int *fds, int n)
{
	char cbuf[CMSG_SPACE(4 * sizeof(int))], b;
	struct iovec iov = { .iov_base = &b, .iov_len = 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = CMSG_SPACE(n * sizeof(int)) };
	struct cmsghdr *c;

	if (recvmsg(sock, &m, 0) != 1)
		return -1;
	c = CMSG_FIRSTHDR(&m);
	if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(n * sizeof(int)))
		return -1;
	memcpy(fds, CMSG_DATA(c), n * sizeof(int));
	return 0;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		void (*fn)(void);
	} tests[] = {
		{ "pin-race", test_pin_race },
		{ "pin-revoke", test_pin_revoke },
		{ "free-table", test_free_table },
		{ "len", test_len },
		{ "put-fail", test_put_fail },
		{ "owner", test_owner },
		{ "identity", test_identity },
		{ "memcg", test_memcg },
		{ "access", test_access },
		{ "get-pages-fault", test_get_pages_fault },
		{ "put-context", test_put_context },
		{ "get-errors", test_get_errors },
		{ "orphan-lock", test_orphan_lock },
		{ "owner-exit-shared", test_owner_exit_shared },
		{ "userns-caps", test_userns_caps },
	};
	size_t i;

	if (argc < 2) {
		fprintf(stderr, "usage: %s SUBTEST [SECONDS]\n", argv[0]);
		return 2;
	}
	if (argc == 4 && !strcmp(argv[1], "identity-exec"))
		return identity_exec("/proc/self/exe", atoi(argv[2]), atoi(argv[3]));
	if (argc > 2)
		seconds = atoi(argv[2]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	kt_require_devices();
	sim = kt_sim_open();
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	for (i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		if (strcmp(argv[1], tests[i].name))
			continue;
		kt_diag("subtest %s", tests[i].name);
		tests[i].fn();
		kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
		return kt_done();
	}
	fprintf(stderr, "%s: no subtest %s\n", argv[0], argv[1]);
	return 2;
}
