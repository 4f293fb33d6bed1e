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
 *
 * Usage: kmod_harden_test SUBTEST [SECONDS]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kmod_test.h"

#define TEST_GID 4242	/* group given /dev/gdrcache by the tests */
#define USER_A 1000
#define USER_B 1001

static int sim;
static int seconds = 5;

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static unsigned long long taint(void)
{
	unsigned long long v = 0;
	FILE *f = fopen("/proc/sys/kernel/tainted", "r");

	if (f) {
		if (fscanf(f, "%llu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/* A module parameter as a number; -1 if it does not exist. */
static long long param(const char *module, const char *name)
{
	char path[160];
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/module/%s/parameters/%s", module, name);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static int set_param_ull(const char *name, unsigned long long v)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%llu", v);
	return kt_set_param("gdrcache", name, buf);
}

static void stats(struct nvp2p_sim_stats *s)
{
	if (kt_sim_stats(sim, s)) {
		perror("nvp2p_sim GET_STATS");
		exit(2);
	}
}

/* Wait up to secs for the provider to hold exactly pins + persistent. */
static int wait_sim(unsigned long long pins, unsigned long long persistent, double secs)
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

static int wait_orphans(long long want, double secs)
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
static int as_user(uid_t uid, gid_t gid, int (*fn)(void *), void *arg)
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

static int send_fds(int sock, const int *fds, int n)
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

static int recv_fds(int sock, int *fds, int n)
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

static void test_pin_race(void)
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

static int nonblocking_events(int fd, struct gdrcache_event *ev, int n)
{
	int fl = fcntl(fd, F_GETFL);
	ssize_t r;

	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	r = read(fd, ev, n * sizeof(*ev));
	fcntl(fd, F_SETFL, fl);
	return r < 0 ? -errno : (int)(r / sizeof(*ev));
}

static void test_pin_revoke(void)
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
		n = nonblocking_events(j.fd, ev, 8);
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

static void test_free_table(void)
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

static void test_len(void)
{
	unsigned long long t0 = taint();
	struct nvp2p_sim_stats s0;
	int ret;

	stats(&s0);
	if (chown("/dev/gdrcache", 0, TEST_GID))
		kt_diag("chown /dev/gdrcache: %s", strerror(errno));
	kt_expect(huge_pins(NULL), 0, "root: PIN of 32 TiB, 1 TiB + 64 KiB, 128 TiB, 2^32 - 1 pages: refused");
	ret = as_user(65534, TEST_GID, huge_pins, NULL);
	kt_expect(ret, 0, "nobody: the same refused");
	kt_check(taint() == t0, "kernel not tainted (taint %llu -> %llu)", t0, taint());
	kt_check(wait_sim(s0.outstanding_pins, s0.outstanding_persistent, 1), "sim: no pin made");
	chown("/dev/gdrcache", 0, 0);
}

/* ---- 10: put_pages fails ------------------------------------------------------------------ */

static int delete_module(const char *name)
{
	return syscall(SYS_delete_module, name, O_NONBLOCK) ? -errno : 0;
}

static void test_put_fail(void)
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

static void test_owner(void)
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
static int identity_exec(const char *self, int fd, int n)
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

static void test_identity(void)
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

/* ---- 13: memory cgroup ---------------------------------------------------------------------- */

static long long cg_read(const char *file)
{
	char path[128];
	long long v = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/fs/cgroup/gdrtest/%s", file);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static int cg_write(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY), ret = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, s, strlen(s)) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

static void test_memcg(void)
{
	enum { NFILES = 64, NPINS = 64 };
	char pid[32], *buf;
	int fds[NFILES], i, fd;
	long long before, after;
	uint64_t id, h[NPINS];
	struct gdrcache_pin p;

	mkdir("/sys/fs/cgroup/gdrtest", 0755);
	cg_write("/sys/fs/cgroup/cgroup.subtree_control", "+memory");
	snprintf(pid, sizeof(pid), "%d", getpid());
	if (cg_write("/sys/fs/cgroup/gdrtest/cgroup.procs", pid) || cg_read("memory.current") < 0) {
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
	cg_write("/sys/fs/cgroup/cgroup.procs", pid);
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

static void test_access(void)
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

static void test_get_pages_fault(void)
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

/* ---- issue 15: NVIDIA's put_pages only works in the pinning process ----------------------- */

/*
 * NVIDIA's RmP2PPutPages() finds a callback-mode page table among the RM
 * clients of the calling pid; from any other context (a kworker, another
 * process) it finds nothing and nvidia_p2p_put_pages() returns 0 having
 * released nothing (the simulator does the same). A module that retried an
 * orphan from a workqueue would count it given back while NVIDIA still holds
 * it, free the region, and meet the free callback later with freed memory.
 */
static void test_put_context(void)
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

static void test_get_errors(void)
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
