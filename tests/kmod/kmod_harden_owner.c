// SPDX-License-Identifier: MIT
/*
 * kmod_harden_test's subtests of ownership (VM case 26): pins do not outlive their owner (issue
 * 10 #11: SCM_RIGHTS, a fork-inherited file and mapping, close while mapped, dup), and a new
 * process with the dead owner's pid and mm address cannot use its file (#12).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kmod_harden.h"

/* ---- 11: pins do not outlive their owner -------------------------------------------------- */

/* Owner body: open both devices, pin 2 + 1 persistent, report through fd w. */
static int owner_pin(int *gfd, int *sfd)
{
	char *buf = kt_gpu_mem(2 * KT_GPU_PAGE);
	uint64_t id;

	*sfd = kt_sim_open();
	*gfd = kt_gdr_open();
	if (kt_sim_alloc(*sfd, buf, 2 * KT_GPU_PAGE, &id) ||
	    kt_gdr_pin(*gfd, (uintptr_t)buf, KT_GPU_PAGE, 0, NULL) ||
	    kt_gdr_pin(*gfd, (uintptr_t)buf, 2 * KT_GPU_PAGE, 0, NULL) ||
	    kt_gdr_pin(*gfd, (uintptr_t)buf, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, NULL))
		return -1;
	return 0;
}

void test_owner(void)
{
	struct gdrcache_version v;
	int sv[2], fds[2], status, p[2];
	pid_t pid, gc;

	/* a. Both files passed over SCM_RIGHTS, then the owner exits. */
	socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	pid = fork();
	if (pid == 0) {
		int g, s;

		if (owner_pin(&g, &s))
			_exit(1);
		fds[0] = g;
		fds[1] = s;
		_exit(send_fds(sv[1], fds, 2) ? 2 : 0);
	}
	kt_check(!recv_fds(sv[0], fds, 2), "received the owner's files");
	waitpid(pid, &status, 0);
	kt_check(WIFEXITED(status) && !WEXITSTATUS(status), "owner pinned and exited");
	kt_check(wait_sim(0, 0, 2), "SCM_RIGHTS: the owner's death released its pins");
	kt_expect(kt_gdr_version(fds[0], &v), -EACCES, "the receiver may not use the file");
	close(fds[0]);
	close(fds[1]);

	/* b. Fork-inherited file: the owner exits, its child lives on with the file. */
	if (pipe(p))
		return;
	pid = fork();
	if (pid == 0) {
		int g, s;

		if (owner_pin(&g, &s))
			_exit(1);
		gc = fork();
		if (gc == 0) {
			close(p[0]);
			pause();
			_exit(0);
		}
		if (write(p[1], &gc, sizeof(gc)) != sizeof(gc))
			_exit(3);
		_exit(0);
	}
	close(p[1]);
	if (read(p[0], &gc, sizeof(gc)) != sizeof(gc))
		gc = 0;
	close(p[0]);
	waitpid(pid, &status, 0);
	kt_check(WIFEXITED(status) && !WEXITSTATUS(status) && gc > 0, "owner pinned, forked, exited");
	kt_check(wait_sim(0, 0, 2), "fork: the owner's death released its pins, its child holds the file");
	if (gc > 0) {
		kill(gc, SIGKILL);
		waitpid(gc, NULL, 0);
	}

	/* c. The revocation area is not inherited by fork(). */
	{
		int fd = kt_gdr_open();
		volatile const uint64_t *area;

		kt_gdr_version(fd, &v);
		area = mmap(NULL, v.revoke_area_size, PROT_READ, MAP_SHARED, fd, 0);
		if (kt_check(area != MAP_FAILED, "owner maps the area")) {
			pid = fork();
			if (pid == 0) {
				(void)area[0];	/* SIGSEGV if the mapping was not copied */
				_exit(0);
			}
			waitpid(pid, &status, 0);
			kt_check(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV,
				 "fork: the child has no revocation area (VM_DONTCOPY; status 0x%x)",
				 status);
			munmap((void *)area, v.revoke_area_size);
		}
		close(fd);
	}

	/* d. close() while mapped releases the pins at once; the mapping stays readable. */
	pid = fork();
	if (pid == 0) {
		int g, s, ok;
		volatile const uint64_t *area;
		struct nvp2p_sim_stats st;

		if (owner_pin(&g, &s))
			_exit(1);
		kt_gdr_version(g, &v);
		area = mmap(NULL, v.revoke_area_size, PROT_READ, MAP_SHARED, g, 0);
		if (area == MAP_FAILED)
			_exit(2);
		close(g);
		kt_sim_stats(s, &st);
		ok = !st.outstanding_pins && !st.outstanding_persistent;
		(void)area[0];
		munmap((void *)area, v.revoke_area_size);
		_exit(ok ? 0 : 4);
	}
	waitpid(pid, &status, 0);
	kt_check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		 "close() while mapped released every pin before munmap (status 0x%x)", status);

	/* e. dup: the owner's close of either descriptor ends the file. */
	{
		int fd = kt_gdr_open(), fd2 = dup(fd);

		close(fd);
		kt_expect(kt_gdr_version(fd2, &v), -EACCES, "dup: after close(fd), fd2 is refused");
		close(fd2);
	}
	kt_check(wait_sim(0, 0, 1), "sim: nothing left");
}

/* ---- 12: owner identity ------------------------------------------------------------------- */

/* Runs in the clone: our descriptor table, its own memory. Exits with the fd. */
static int clone_owner_main(void *arg)
{
	int fd = open("/dev/gdrcache", O_RDWR);

	return fd >= 0 && fd < 255 ? fd : 255;
}

/*
 * The new process (same pid as the dead owner) checks whether it may use the file, then execs
 * itself n more times and checks again each time: every exec allocates a new mm, which may land
 * where the owner's was. Exit 1 if the file ever worked.
 */
int identity_exec(const char *self, int fd, int n)
{
	struct gdrcache_version v;
	char fds[16], ns[16];

	if (kt_gdr_version(fd, &v) == 0)
		return 1;
	if (n <= 0)
		return 0;
	snprintf(fds, sizeof(fds), "%d", fd);
	snprintf(ns, sizeof(ns), "%d", n - 1);
	execl(self, self, "identity-exec", fds, ns, (char *)NULL);
	return 2;
}

void test_identity(void)
{
	static char stack[64 * 1024] __attribute__((aligned(16)));
	struct gdrcache_version v;
	int status, tries, matched = 0, owned = 0, clone_owner_fd;
	cpu_set_t cpu0;
	pid_t owner, n;

	/* One CPU: freed mm_structs come back first from that CPU's slab. */
	CPU_ZERO(&cpu0);
	CPU_SET(0, &cpu0);
	sched_setaffinity(0, sizeof(cpu0), &cpu0);
	/* The owner shares our descriptor table: its exit closes nothing. */
	owner = clone(clone_owner_main, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL);
	if (!kt_check(owner > 0, "clone(CLONE_FILES) owner"))
		return;
	waitpid(owner, &status, 0);
	clone_owner_fd = WIFEXITED(status) && WEXITSTATUS(status) != 255 ? WEXITSTATUS(status) : -1;
	if (!kt_check(clone_owner_fd >= 0, "the owner opened /dev/gdrcache (fd %d) and exited",
		      clone_owner_fd))
		return;
	kt_expect(kt_gdr_version(clone_owner_fd, &v), -EACCES, "its sibling may not use the file");
	for (tries = 0; tries < 10; tries++) {
		FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");

		if (!f)
			break;
		fprintf(f, "%d", owner - 1);
		fclose(f);
		n = fork();
		if (n == 0)
			_exit(identity_exec("/proc/self/exe", clone_owner_fd, 5));
		waitpid(n, &status, 0);
		if (n != owner)
			continue;
		matched++;
		owned += WIFEXITED(status) && WEXITSTATUS(status) == 1;
	}
	kt_check(matched > 0, "a new process got the dead owner's pid %d (%d of %d tries, each "
		 "exec'ing 5 times)", owner, matched, tries);
	kt_check(owned == 0, "none of them could use the file (%d could)", owned);
	close(clone_owner_fd);
}
