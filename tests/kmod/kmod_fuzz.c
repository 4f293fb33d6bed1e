// SPDX-License-Identifier: MIT
/*
 * kmod_fuzz: a bounded-time ioctl fuzz of /dev/gdrcache against nvp2p_sim.ko.
 * Two processes, one root and one unprivileged (uid 65534 in the device's
 * group), each with several threads, issue random commands (known and unknown
 * numbers, wrong sizes and directions), random arguments (pointers to good,
 * read-only, unmapped, kernel and truncated memory; random handles, lengths
 * and flags), read / poll / mmap / munmap, close and reopen the file, fork
 * children that poke the inherited file, and free the simulated GPU memory
 * under the pins (firing callbacks). Root also injects provider faults,
 * put_pages failures included. At the end: every pin given back (no leak, no
 * orphan) and the kernel not tainted. The guest's harness fails the case on
 * any oops or WARN as well.
 *
 * Usage: kmod_fuzz [-t seconds] [-s seed] [-j threads]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kmod_test.h"

#define TEST_GID 4242
#define NALLOC 4
#define NHANDLES 64
#define ALLOC_MAX (16 * KT_GPU_PAGE)

static int seconds = 20, nthreads = 3;
static unsigned int seed0 = 1;
static int is_root;
static double deadline;

/* Per fuzzing process. */
static atomic_int gfd = -1;		/* the current /dev/gdrcache file */
static int simfd;
static char *bufs[NALLOC];
static atomic_ullong alloc_id[NALLOC];	/* 0: not declared to the sim */
static atomic_ullong handles[NHANDLES];
static char *good;			/* 2 pages read-write, then a PROT_NONE page */
static char *ro;			/* a read-only page */
static atomic_long nops, nok;

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t rnd64(unsigned int *s)
{
	return ((uint64_t)rand_r(s) << 42) ^ ((uint64_t)rand_r(s) << 21) ^ rand_r(s);
}

/* A user pointer for an argument of size n: mostly good, sometimes not. */
static void *rnd_ptr(unsigned int *s, size_t n)
{
	switch (rand_r(s) % 16) {
	case 0:
		return NULL;
	case 1:
		return (void *)(uintptr_t)(rand_r(s) % 4096);
	case 2:
		return (void *)0xffff888000000000ULL;	/* kernel direct map */
	case 3:
		return ro;
	case 4:
		return good + 2 * 4096 - n / 2;	/* runs into the PROT_NONE page */
	case 5:
		return (void *)(uintptr_t)rnd64(s);
	default:
		return good;
	}
}

static uint64_t rnd_handle(unsigned int *s)
{
	switch (rand_r(s) % 4) {
	case 0:
		return rnd64(s);
	case 1:
		return (uint64_t)(rand_r(s) % 8) << 32 | (rand_r(s) % 8);
	default:
		return atomic_load(&handles[rand_r(s) % NHANDLES]);
	}
}

static void rnd_pin_args(unsigned int *s, struct gdrcache_pin *p)
{
	int i = rand_r(s) % NALLOC;
	uint64_t off, len;

	memset(p, 0, sizeof(*p));
	switch (rand_r(s) % 8) {
	case 0:		/* anything */
		p->va = rnd64(s);
		p->len = rnd64(s);
		break;
	case 1:		/* aligned, anywhere, any size */
		p->va = rnd64(s) & ~(KT_GPU_PAGE - 1);
		p->len = (rnd64(s) >> (rand_r(s) % 48)) & ~(KT_GPU_PAGE - 1);
		break;
	case 2:		/* huge */
		p->va = (uintptr_t)bufs[i];
		p->len = 1ULL << (36 + rand_r(s) % 12);
		break;
	default:	/* inside one of our allocations (declared or not) */
		off = (rand_r(s) % 16) * KT_GPU_PAGE;
		len = (1 + rand_r(s) % 16) * KT_GPU_PAGE;
		p->va = (uintptr_t)bufs[i] + off;
		p->len = len;
		break;
	}
	p->flags = rand_r(s) % 3 == 0 ? GDRCACHE_PIN_PERSISTENT : 0;
	if (rand_r(s) % 32 == 0)
		p->flags = rand_r(s);
	if (rand_r(s) % 32 == 0)
		p->reserved0 = 1;
	if (rand_r(s) % 32 == 0)
		p->reserved[rand_r(s) % 4] = rnd64(s);
}

static void remember(unsigned int *s, uint64_t h)
{
	atomic_store(&handles[rand_r(s) % NHANDLES], h);
}

static void op_ioctl(unsigned int *s, int fd)
{
	union {
		struct gdrcache_pin pin;
		struct gdrcache_unpin unpin;
		struct gdrcache_get_pages gp;
		struct gdrcache_version v;
		char raw[256];
	} a;
	unsigned long cmd;
	void *arg = &a;
	int r = rand_r(s) % 16, ret;

	memset(&a, 0, sizeof(a));
	if (r < 5) {
		cmd = GDRCACHE_IOCTL_PIN;
		rnd_pin_args(s, &a.pin);
	} else if (r < 8) {
		cmd = GDRCACHE_IOCTL_UNPIN;
		a.unpin.handle = rnd_handle(s);
		if (rand_r(s) % 32 == 0)
			a.unpin.flags = rand_r(s);
	} else if (r < 11) {
		cmd = GDRCACHE_IOCTL_GET_PAGES;
		a.gp.handle = rnd_handle(s);
		a.gp.pages_ptr = (uintptr_t)rnd_ptr(s, 8);
		a.gp.max_pages = rand_r(s) % 4 ? (uint32_t)(rand_r(s) % 32) : (uint32_t)rnd64(s);
		if (rand_r(s) % 32 == 0)
			a.gp.reserved[rand_r(s) % 2] = 1;
	} else if (r < 12) {
		cmd = GDRCACHE_IOCTL_GET_VERSION;
	} else {
		/* Unknown numbers, wrong sizes and directions, mostly our magic. */
		cmd = _IOC(rand_r(s) % 4, rand_r(s) % 8 ? GDRCACHE_IOCTL_MAGIC : rand_r(s) % 256,
			   rand_r(s) % 16, rand_r(s) % 256);
		for (r = 0; r < (int)sizeof(a.raw); r++)
			a.raw[r] = rand_r(s);
	}
	if (rand_r(s) % 8 == 0)
		arg = rnd_ptr(s, sizeof(a));
	ret = ioctl(fd, cmd, arg);
	atomic_fetch_add(&nops, 1);
	if (ret == 0) {
		atomic_fetch_add(&nok, 1);
		if (cmd == GDRCACHE_IOCTL_PIN && arg == &a)
			remember(s, a.pin.handle);
	}
}

static void op_read_poll(unsigned int *s, int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	size_t n = rand_r(s) % 4 ? 32 * (rand_r(s) % 9) : rand_r(s) % 300;

	if (rand_r(s) % 2)
		(void)!read(fd, rnd_ptr(s, n), n);
	else
		poll(&p, 1, 0);
}

static void op_mmap(unsigned int *s, int fd)
{
	size_t len = rand_r(s) % 4 ? 4096 * (size_t)(1 + rand_r(s) % 12) : rnd64(s) % (1 << 24);
	int prot = rand_r(s) % 4 ? PROT_READ : rand_r(s) % 8;
	off_t off = rand_r(s) % 8 ? 0 : 4096 * (rand_r(s) % 4);
	volatile char *m = mmap(NULL, len, prot, MAP_SHARED, fd, off);

	if (m == MAP_FAILED)
		return;
	if (prot & PROT_READ)
		(void)m[0];
	if (rand_r(s) % 2)
		mprotect((void *)m, len, PROT_READ | PROT_WRITE);
	munmap((void *)m, len);
}

static void op_sim(unsigned int *s)
{
	int i = rand_r(s) % NALLOC;
	uint64_t id = atomic_exchange(&alloc_id[i], 0), nid;

	if (id) {
		kt_sim_free(simfd, id);		/* fires the callbacks of its pins */
		return;
	}
	if (!kt_sim_alloc(simfd, bufs[i], ALLOC_MAX, &nid)) {
		id = 0;
		if (!atomic_compare_exchange_strong(&alloc_id[i], &id, nid))
			kt_sim_free(simfd, nid);
	}
}

static void op_fault(unsigned int *s)
{
	static const uint32_t types[] = {
		NVP2P_SIM_FAULT_NONE, NVP2P_SIM_FAULT_ENOMEM_AFTER, NVP2P_SIM_FAULT_EIO_NEXT,
		NVP2P_SIM_FAULT_CALLBACK_DELAY, NVP2P_SIM_FAULT_PUT_ENOMEM,
		NVP2P_SIM_FAULT_GET_DELAY,
	};
	uint32_t t = types[rand_r(s) % 6];
	uint64_t v = rand_r(s) % 4;

	if (t == NVP2P_SIM_FAULT_CALLBACK_DELAY || t == NVP2P_SIM_FAULT_GET_DELAY)
		v = rand_r(s) % 2000;
	else if (t == NVP2P_SIM_FAULT_ENOMEM_AFTER)
		v = rand_r(s) % 64;
	kt_sim_fault(simfd, t, v);
}

/* Close the file and open a new one (the owner's close ends the old one). */
static void op_reopen(unsigned int *s)
{
	int fd = open("/dev/gdrcache", O_RDWR | O_CLOEXEC | O_NONBLOCK);

	if (fd < 0)
		return;
	fd = atomic_exchange(&gfd, fd);
	if (fd >= 0)
		close(fd);
}

/* A child pokes the inherited file (it may not use it) and exits, maybe mid-call. */
static void op_fork(unsigned int *s, int fd)
{
	unsigned int cs = rand_r(s);
	pid_t pid = fork();
	int i;

	if (pid == 0) {
		for (i = 0; i < 8; i++)
			op_ioctl(&cs, fd);
		op_mmap(&cs, fd);
		if (rand_r(&cs) % 2)
			close(fd);
		_exit(0);
	}
	if (pid > 0) {
		if (rand_r(s) % 4 == 0)
			kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
}

static void *fuzz_thread(void *arg)
{
	unsigned int s = (unsigned int)(uintptr_t)arg;
	int fd, r;

	while (now() < deadline) {
		fd = atomic_load(&gfd);
		r = rand_r(&s) % 100;
		if (r < 60)
			op_ioctl(&s, fd);
		else if (r < 70)
			op_read_poll(&s, fd);
		else if (r < 78)
			op_mmap(&s, fd);
		else if (r < 92)
			op_sim(&s);
		else if (r < 95 && is_root)
			op_fault(&s);
		else if (r < 97)
			op_reopen(&s);
		else
			op_fork(&s, fd);
	}
	return NULL;
}

static int fuzz_process(unsigned int seed)
{
	pthread_t t[16];
	int i;

	good = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	mprotect(good + 2 * 4096, 4096, PROT_NONE);
	ro = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	for (i = 0; i < NALLOC; i++)
		bufs[i] = kt_gpu_mem(ALLOC_MAX);
	simfd = open(NVP2P_SIM_DEVICE, O_RDWR | O_CLOEXEC);
	atomic_store(&gfd, open("/dev/gdrcache", O_RDWR | O_CLOEXEC | O_NONBLOCK));
	if (simfd < 0 || atomic_load(&gfd) < 0) {
		printf("# %s: cannot open the devices: %s\n", is_root ? "root" : "nobody",
		       strerror(errno));
		return 1;
	}
	for (i = 0; i < nthreads; i++)
		pthread_create(&t[i], NULL, fuzz_thread, (void *)(uintptr_t)(seed * 7919 + i));
	for (i = 0; i < nthreads; i++)
		pthread_join(t[i], NULL);
	printf("# %s: %ld calls, %ld succeeded\n", is_root ? "root" : "nobody",
	       atomic_load(&nops), atomic_load(&nok));
	fflush(stdout);
	return 0;	/* exiting gives back every pin and allocation */
}

static long long orphans(void)
{
	long long v = -1;
	FILE *f = fopen("/sys/module/gdrcache/parameters/orphans", "r");

	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

int main(int argc, char **argv)
{
	/* Bad page, oops, WARN, soft lockup (tests/vm/init). */
	const unsigned long long bad = (1 << 5) | (1 << 7) | (1 << 9) | (1 << 14);
	struct nvp2p_sim_stats st;
	unsigned long long t0;
	pid_t pid[2];
	int c, i, status, sim, clean = 0;
	double end;

	while ((c = getopt(argc, argv, "t:s:j:")) != -1) {
		switch (c) {
		case 't': seconds = atoi(optarg); break;
		case 's': seed0 = strtoul(optarg, NULL, 0); break;
		case 'j': nthreads = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-t seconds] [-s seed] [-j threads]\n", argv[0]);
			return 2;
		}
	}
	if (nthreads < 1 || nthreads > 16)
		nthreads = 3;
	setvbuf(stdout, NULL, _IOLBF, 0);
	kt_require_devices();
	sim = kt_sim_open();
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	t0 = kt_taint();
	if (chown("/dev/gdrcache", 0, TEST_GID))
		kt_diag("chown /dev/gdrcache: %s", strerror(errno));
	kt_diag("%d s, seed %u, %d threads per process", seconds, seed0, nthreads);
	deadline = now() + seconds;

	for (i = 0; i < 2; i++) {
		pid[i] = fork();
		if (pid[i] == 0) {
			is_root = i == 0;
			if (!is_root) {
				gid_t g[1] = { TEST_GID };

				if (setgroups(1, g) || setgid(TEST_GID) || setuid(65534))
					_exit(100);
			}
			_exit(fuzz_process(seed0 + i));
		}
	}
	for (i = 0; i < 2; i++) {
		waitpid(pid[i], &status, 0);
		kt_check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s fuzzer finished (0x%x)",
			 i ? "unprivileged" : "root", status);
	}
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	/* Orphans are retried every second. */
	for (end = now() + 10; now() < end; usleep(100 * 1000)) {
		kt_sim_stats(sim, &st);
		if (!st.outstanding_pins && !st.outstanding_persistent && !st.allocations &&
		    orphans() == 0) {
			clean = 1;
			break;
		}
	}
	kt_sim_stats(sim, &st);
	kt_check(clean, "no leaked pin: sim holds %llu callback pins, %llu persistent, %llu "
		 "allocations; gdrcache %lld orphans", (unsigned long long)st.outstanding_pins,
		 (unsigned long long)st.outstanding_persistent, (unsigned long long)st.allocations,
		 orphans());
	kt_diag("sim: %llu pins made, %llu callbacks fired", (unsigned long long)st.total_pins,
		(unsigned long long)st.callbacks_fired);
	kt_check((kt_taint() & bad) == (t0 & bad), "kernel not tainted (%llu -> %llu)", t0, kt_taint());
	chown("/dev/gdrcache", 0, 0);
	return kt_done();
}
