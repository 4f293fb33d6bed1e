// SPDX-License-Identifier: MIT
/*
 * kmod_ioctl_test: the ioctl, mmap, read and poll ABI of /dev/gdrcache against
 * the simulated provider nvp2p_sim.ko: argument checking case by case, then the
 * working paths (pin, page list, revocation events, persistent pins, release on
 * close, fault mapping). Runs as root inside the test VM; TAP output.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kmod_test.h"

#define BUF_PAGES 16
#define BUF_LEN (BUF_PAGES * KT_GPU_PAGE)

static int sim;

/* Run fn(arg) in a forked child; return what it returned (a -errno). */
static int in_child(int (*fn)(int fd), int fd)
{
	int status;
	pid_t pid = fork();

	if (pid == 0)
		_exit(-fn(fd));
	if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
		return -1000;
	return -WEXITSTATUS(status);
}

static int child_ioctl(int fd)
{
	struct gdrcache_version v;

	return kt_gdr_version(fd, &v);
}

static int child_mmap(int fd)
{
	void *p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);

	if (p == MAP_FAILED)
		return -errno;
	munmap(p, 4096);
	return 0;
}

static int child_read(int fd)
{
	struct gdrcache_event ev;

	return read(fd, &ev, sizeof(ev)) < 0 ? -errno : 0;
}

struct blocked_read {
	int fd;
	ssize_t ret;
	struct gdrcache_event ev;
};

static void *blocked_read_main(void *arg)
{
	struct blocked_read *br = arg;

	br->ret = read(br->fd, &br->ev, sizeof(br->ev));
	return NULL;
}

static void stats(struct nvp2p_sim_stats *s)
{
	if (kt_sim_stats(sim, s)) {
		perror("GET_STATS");
		exit(2);
	}
}

static int poll_in(int fd, int timeout_ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

/*
 * What the cases share. They run in the order of the table below, each on what the ones before it
 * left: the version (max_pins, the area's size), the memory A, B, C, N, the good pin of "pin"
 * (which "get_pages" and "unpin" use), the revocation area "revoke_area" maps.
 */
struct ctx {
	struct nvp2p_sim_stats s0;	/* the provider's counts at the start */
	struct gdrcache_version v;
	struct gdrcache_pin pin;
	const volatile struct gdrcache_revoke_area *area;
	uint64_t idA, idB, idC, old_handle;
	char *bufA, *bufBC, *bufN;
	void *m;
	int fd;
};

/* What a case returns: 0 to go on, STOP to end the run with the plan (kt_done()), or the exit
 * status to end it with at once. */
#define STOP (-1)

/* Version handshake. */
static int case_version(struct ctx *c)
{
	int ret;

	ret = kt_gdr_version(c->fd, &c->v);
	kt_expect(ret, 0, "GET_VERSION");
	kt_check(c->v.major == GDRCACHE_UAPI_VERSION_MAJOR, "major %u == %u", c->v.major,
		 GDRCACHE_UAPI_VERSION_MAJOR);
	kt_check((c->v.features & GDRCACHE_FEAT_EVENTS) &&
		 (c->v.features & GDRCACHE_FEAT_PERSISTENT),
		 "features 0x%x have EVENTS and PERSISTENT", c->v.features);
	kt_check(c->v.max_pins > 0 && c->v.revoke_area_size >= 64 + 8ULL * c->v.max_pins &&
		 c->v.revoke_area_size % 4096 == 0,
		 "max_pins %u, revoke_area_size %llu", c->v.max_pins,
		 (unsigned long long)c->v.revoke_area_size);
	memset(&c->v, 0, sizeof(c->v));
	c->v.reserved[3] = 1;
	kt_expect(kt_ioctl(c->fd, GDRCACHE_IOCTL_GET_VERSION, &c->v), -EINVAL,
		  "GET_VERSION with reserved[3] != 0: EINVAL");
	kt_gdr_version(c->fd, &c->v);
	return 0;
}

/* GPU memory: A (16 pages), B and C adjacent (2 pages each), N never declared. */
static int case_gpu_memory(struct ctx *c)
{
	c->bufA = kt_gpu_mem(BUF_LEN);
	c->bufBC = kt_gpu_mem(4 * KT_GPU_PAGE);
	c->bufN = kt_gpu_mem(2 * KT_GPU_PAGE);
	if (kt_sim_alloc(sim, c->bufA, BUF_LEN, &c->idA) ||
	    kt_sim_alloc(sim, c->bufBC, 2 * KT_GPU_PAGE, &c->idB) ||
	    kt_sim_alloc(sim, c->bufBC + 2 * KT_GPU_PAGE, 2 * KT_GPU_PAGE, &c->idC)) {
		perror("nvp2p_sim ALLOC");
		return 2;
	}
	return 0;
}

/* PIN argument checks. */
static int case_pin_arguments(struct ctx *c)
{
	struct nvp2p_sim_stats s;
	struct gdrcache_pin pin;
	int fd = c->fd;

	kt_expect(kt_gdr_pin(fd, (uintptr_t)c->bufA + 4096, KT_GPU_PAGE, 0, NULL), -EINVAL,
		  "PIN misaligned va: EINVAL");
	kt_expect(kt_gdr_pin(fd, (uintptr_t)c->bufA, KT_GPU_PAGE + 4096, 0, NULL), -EINVAL,
		  "PIN misaligned len: EINVAL");
	kt_expect(kt_gdr_pin(fd, (uintptr_t)c->bufA, 0, 0, NULL), -EINVAL, "PIN zero len: EINVAL");
	kt_expect(kt_gdr_pin(fd, 0xffffffffffff0000ULL, 2 * KT_GPU_PAGE, 0, NULL), -EINVAL,
		  "PIN va + len wraps: EINVAL");
	kt_expect(kt_gdr_pin(fd, (uintptr_t)c->bufA, KT_GPU_PAGE, 1U << 31, NULL), -EINVAL,
		  "PIN unknown flag: EINVAL");
	memset(&pin, 0, sizeof(pin));
	pin.va = (uintptr_t)c->bufA;
	pin.len = KT_GPU_PAGE;
	pin.reserved0 = 1;
	kt_expect(kt_ioctl(fd, GDRCACHE_IOCTL_PIN, &pin), -EINVAL, "PIN reserved0 != 0: EINVAL");
	pin.reserved0 = 0;
	pin.reserved[2] = 1;
	kt_expect(kt_ioctl(fd, GDRCACHE_IOCTL_PIN, &pin), -EINVAL, "PIN reserved[2] != 0: EINVAL");
	kt_expect(kt_ioctl(fd, GDRCACHE_IOCTL_PIN, (void *)16), -EFAULT, "PIN bad argument pointer: EFAULT");
	kt_expect(kt_gdr_pin(fd, (uintptr_t)c->bufN, KT_GPU_PAGE, 0, NULL), -EINVAL,
		  "PIN of memory in no allocation: EINVAL");
	kt_expect(kt_gdr_pin(fd, (uintptr_t)c->bufBC + KT_GPU_PAGE, 2 * KT_GPU_PAGE, 0, NULL),
		  -EINVAL, "PIN spanning two allocations: EINVAL");
	kt_expect(kt_gdr_pin(fd, (uintptr_t)c->bufA, 2 * BUF_LEN, 0, NULL), -EINVAL,
		  "PIN running past the allocation's end: EINVAL");
	stats(&s);
	kt_check(s.outstanding_pins == c->s0.outstanding_pins,
		 "no pin left behind by the failures");
	return 0;
}

/* A good pin, kept for the GET_PAGES and UNPIN cases. */
static int case_pin(struct ctx *c)
{
	struct gdrcache_pin *pin = &c->pin;
	FILE *f;
	unsigned int ver = 0;
	int ret;

	ret = kt_gdr_pin(c->fd, (uintptr_t)c->bufA, BUF_LEN, 0, pin);
	kt_expect(ret, 0, "PIN 16 pages");
	kt_check(pin->handle && GDRCACHE_HANDLE_GEN(pin->handle) && pin->page_count == BUF_PAGES &&
		 pin->page_size == GDRCACHE_PAGE_SIZE,
		 "handle 0x%llx, %u pages of %u bytes", (unsigned long long)pin->handle,
		 pin->page_count, pin->page_size);
	kt_check(!memcmp(pin->gpu_uuid, "nvp2p_sim-GPU-0", 16), "GPU UUID from the page table");
	f = fopen("/sys/module/nvp2p_sim/parameters/page_table_version", "r");
	if (f) {
		if (fscanf(f, "%u", &ver) != 1)
			ver = 0;
		fclose(f);
	}
	kt_check(ver == 0x00010002, "the simulator hands out page table 1.2, as drivers do "
		 "(0x%08x)", ver);
	return 0;
}

/* GET_PAGES of the good pin. */
static int case_get_pages(struct ctx *c)
{
	struct gdrcache_get_pages gp;
	uint64_t pages[BUF_PAGES + 1], handle = c->pin.handle, e;
	uint32_t count;
	int fd = c->fd, ret, i, pm, match = 0;

	memset(pages, 0, sizeof(pages));
	ret = kt_gdr_get_pages(fd, handle, pages, BUF_PAGES, &count);
	kt_expect(ret, 0, "GET_PAGES");
	for (i = 0; i < BUF_PAGES && pages[i] && !(pages[i] & 4095); i++)
		;
	kt_check(count == BUF_PAGES && i == BUF_PAGES, "GET_PAGES: %u page-aligned addresses", count);
	/* As root, /proc/self/pagemap tells the physical address behind each 64 KiB page. */
	pm = open("/proc/self/pagemap", O_RDONLY);
	for (i = 0; pm >= 0 && i < BUF_PAGES; i++) {
		off_t off = ((uintptr_t)c->bufA + i * KT_GPU_PAGE) / 4096 * 8;

		if (pread(pm, &e, 8, off) == 8 && (e >> 63) &&
		    (e & ((1ULL << 55) - 1)) * 4096 == pages[i])
			match++;
	}
	if (pm >= 0)
		close(pm);
	kt_check(match == BUF_PAGES, "GET_PAGES addresses are the pages' physical addresses (%d)",
		 match);
	memset(pages, 0, sizeof(pages));
	ret = kt_gdr_get_pages(fd, handle, pages, 4, &count);
	kt_check(!ret && count == BUF_PAGES && pages[3] && !pages[4],
		 "GET_PAGES max_pages 4: copies 4, reports %u", count);
	kt_expect(kt_gdr_get_pages(fd, handle, (uint64_t *)8, BUF_PAGES, NULL), -EFAULT,
		  "GET_PAGES bad pages_ptr: EFAULT");
	kt_expect(kt_gdr_get_pages(fd, handle, NULL, 0, &count), 0,
		  "GET_PAGES max_pages 0 only counts");
	memset(&gp, 0, sizeof(gp));
	gp.handle = handle;
	gp.flags = 1;
	kt_expect(kt_ioctl(fd, GDRCACHE_IOCTL_GET_PAGES, &gp), -EINVAL, "GET_PAGES flags != 0: EINVAL");
	gp.flags = 0;
	gp.reserved[1] = 1;
	kt_expect(kt_ioctl(fd, GDRCACHE_IOCTL_GET_PAGES, &gp), -EINVAL,
		  "GET_PAGES reserved[1] != 0: EINVAL");
	kt_expect(kt_gdr_get_pages(fd, handle ^ (1ULL << 40), pages, 1, NULL), -ENOENT,
		  "GET_PAGES unknown handle: ENOENT");
	return 0;
}

/* UNPIN checks: the good pin goes; a slot comes back with a new generation. */
static int case_unpin(struct ctx *c)
{
	struct nvp2p_sim_stats s;
	struct gdrcache_unpin up;
	struct gdrcache_pin pin2;
	uint64_t pages[BUF_PAGES + 1], handle = c->pin.handle;
	int fd = c->fd, ret = 0, i;

	memset(&up, 0, sizeof(up));
	up.handle = handle;
	up.flags = 1;
	kt_expect(kt_ioctl(fd, GDRCACHE_IOCTL_UNPIN, &up), -EINVAL, "UNPIN unknown flag: EINVAL");
	up.flags = 0;
	up.reserved0 = 1;
	kt_expect(kt_ioctl(fd, GDRCACHE_IOCTL_UNPIN, &up), -EINVAL, "UNPIN reserved0 != 0: EINVAL");
	kt_expect(kt_gdr_unpin(fd, 0x1234567800000007ULL), -ENOENT, "UNPIN never-issued handle: ENOENT");
	kt_expect(kt_gdr_unpin(fd, 0xffffffffULL), -ENOENT, "UNPIN slot out of range: ENOENT");
	kt_expect(kt_gdr_unpin(fd, handle), 0, "UNPIN");
	kt_expect(kt_gdr_unpin(fd, handle), -ENOENT, "double UNPIN: ENOENT");
	kt_expect(kt_gdr_get_pages(fd, handle, pages, 1, NULL), -ENOENT,
		  "GET_PAGES stale handle: ENOENT");
	c->old_handle = handle;
	for (i = 0; i < (int)c->v.max_pins + 1; i++) {
		/* Go round the slots until the old one comes back with a new generation. */
		ret = kt_gdr_pin(fd, (uintptr_t)c->bufA, KT_GPU_PAGE, 0, &pin2);
		if (ret || GDRCACHE_HANDLE_SLOT(pin2.handle) == GDRCACHE_HANDLE_SLOT(c->old_handle))
			break;
		kt_gdr_unpin(fd, pin2.handle);
	}
	kt_check(!ret && GDRCACHE_HANDLE_SLOT(pin2.handle) == GDRCACHE_HANDLE_SLOT(c->old_handle) &&
		 pin2.handle != c->old_handle, "a reused slot gets a new generation");
	kt_expect(kt_gdr_unpin(fd, c->old_handle), -ENOENT,
		  "UNPIN stale handle of a reused slot: ENOENT");
	kt_gdr_unpin(fd, pin2.handle);
	stats(&s);
	kt_check(s.outstanding_pins == c->s0.outstanding_pins,
		 "sim: nothing outstanding after unpins");
	return 0;
}

/* Wrong ioctls. */
static int case_wrong_ioctls(struct ctx *c)
{
	struct nvp2p_sim_stats s;

	kt_expect(kt_ioctl(c->fd, _IO(GDRCACHE_IOCTL_MAGIC, 0x7f), NULL), -ENOTTY,
		  "unknown ioctl number: ENOTTY");
	kt_expect(kt_ioctl(c->fd, _IOWR(GDRCACHE_IOCTL_MAGIC, 0x01, uint64_t), &c->old_handle),
		  -ENOTTY, "PIN encoded with a wrong size: ENOTTY");
	kt_expect(kt_ioctl(c->fd, NVP2P_SIM_IOCTL_GET_STATS, &s), -ENOTTY,
		  "another driver's ioctl: ENOTTY");
	return 0;
}

/* Another process. */
static int case_other_process(struct ctx *c)
{
	kt_expect(in_child(child_ioctl, c->fd), -EACCES, "ioctl from a forked child: EACCES");
	kt_expect(in_child(child_mmap, c->fd), -EACCES, "mmap from a forked child: EACCES");
	kt_expect(in_child(child_read, c->fd), -EACCES, "read from a forked child: EACCES");
	return 0;
}

/* The revocation area, mapped for the cases after this one; nothing to read yet. */
static int case_revoke_area(struct ctx *c)
{
	struct gdrcache_event ev[16];
	int fd = c->fd;
	void *m;

	m = mmap(NULL, c->v.revoke_area_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	kt_check(m == MAP_FAILED && (errno == EPERM || errno == EACCES),
		 "mmap writable: %s", m == MAP_FAILED ? strerror(errno) : "mapped");
	m = mmap(NULL, c->v.revoke_area_size + 4096, PROT_READ, MAP_SHARED, fd, 0);
	kt_check(m == MAP_FAILED && errno == EINVAL, "mmap larger than the area: EINVAL");
	m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 4096);
	kt_check(m == MAP_FAILED && errno == EINVAL, "mmap at an offset: EINVAL");
	m = mmap(NULL, c->v.revoke_area_size, PROT_READ, MAP_SHARED, fd, 0);
	kt_check(m != MAP_FAILED, "mmap read-only");
	if (m == MAP_FAILED)
		return STOP;
	c->m = m;
	c->area = m;
	kt_check(c->area->nslots == c->v.max_pins, "area: nslots %u", c->area->nslots);
	kt_check(mprotect(m, c->v.revoke_area_size, PROT_READ | PROT_WRITE) == -1 &&
		 errno == EACCES, "mprotect the area writable: EACCES");
	kt_check(!poll_in(fd, 0), "poll: no event yet");
	kt_expect(kt_read_events(fd, ev, 1), -EAGAIN, "read O_NONBLOCK with no event: EAGAIN");
	kt_expect(read(fd, ev, sizeof(ev[0]) - 1) < 0 ? -errno : 0, -EINVAL,
		  "read smaller than one event: EINVAL");
	return 0;
}

/* A revocation arrives with no call from us: the provider frees D. */
static int case_revocation(struct ctx *c)
{
	const volatile struct gdrcache_revoke_area *area = c->area;
	struct nvp2p_sim_stats s0, s;
	struct gdrcache_event ev[16];
	struct gdrcache_pin pin;
	uint64_t pages[BUF_PAGES + 1], idD, before;
	uint32_t slot;
	char *bufD;
	int fd = c->fd, ret;

	bufD = kt_gpu_mem(2 * KT_GPU_PAGE);
	kt_sim_alloc(sim, bufD, 2 * KT_GPU_PAGE, &idD);
	kt_expect(kt_gdr_pin(fd, (uintptr_t)bufD, 2 * KT_GPU_PAGE, 0, &pin), 0, "PIN D");
	before = __atomic_load_n(&area->revoke_count, __ATOMIC_ACQUIRE);
	slot = GDRCACHE_HANDLE_SLOT(pin.handle);
	stats(&s0);
	kt_expect(kt_sim_free(sim, idD), 0, "nvp2p_sim FREE D (fires the callback)");
	stats(&s);
	kt_check(s.callbacks_fired == s0.callbacks_fired + 1, "sim: one callback fired");
	kt_check(__atomic_load_n(&area->revoke_count, __ATOMIC_ACQUIRE) == before + 1,
		 "area: revoke_count %llu -> %llu", (unsigned long long)before,
		 (unsigned long long)area->revoke_count);
	kt_check(area->slot[slot] == pin.handle, "area: slot[%u] holds the handle", slot);
	kt_check(poll_in(fd, 1000), "poll: POLLIN");
	ret = kt_read_events(fd, ev, 16);
	kt_check(ret == 1 && ev[0].type == GDRCACHE_EVENT_REVOKED && ev[0].handle == pin.handle &&
		 ev[0].va == (uintptr_t)bufD && ev[0].len == 2 * KT_GPU_PAGE,
		 "read: one REVOKED event for D (got %d)", ret);
	kt_check(!poll_in(fd, 0), "poll: quiet after the read");
	kt_expect(kt_gdr_get_pages(fd, pin.handle, pages, 2, NULL), -EIO,
		  "GET_PAGES revoked handle: EIO");
	kt_expect(kt_gdr_unpin(fd, pin.handle), 0, "UNPIN revoked handle");
	kt_expect(kt_gdr_unpin(fd, pin.handle), -ENOENT, "UNPIN revoked handle again: ENOENT");
	return 0;
}

/* A read() blocked in another thread wakes up with the event. */
static int case_blocked_read(struct ctx *c)
{
	struct blocked_read br = { .fd = c->fd };
	struct gdrcache_pin pin;
	uint64_t idD;
	pthread_t t;
	char *bufD;

	bufD = kt_gpu_mem(KT_GPU_PAGE);
	kt_sim_alloc(sim, bufD, KT_GPU_PAGE, &idD);
	kt_gdr_pin(c->fd, (uintptr_t)bufD, KT_GPU_PAGE, 0, &pin);
	pthread_create(&t, NULL, blocked_read_main, &br);
	usleep(100 * 1000);
	kt_sim_free(sim, idD);
	pthread_join(t, NULL);
	kt_check(br.ret == sizeof(br.ev) && br.ev.handle == pin.handle &&
		 br.ev.type == GDRCACHE_EVENT_REVOKED, "blocking read() woken by the revocation");
	kt_gdr_unpin(c->fd, pin.handle);
	return 0;
}

/* A persistent pin survives FREE, with no event. */
static int case_persistent(struct ctx *c)
{
	struct nvp2p_sim_stats s0, s;
	struct gdrcache_pin pin;
	uint64_t pages[BUF_PAGES + 1], idE, before;
	uint32_t count;
	char *bufE;
	int fd = c->fd;

	bufE = kt_gpu_mem(2 * KT_GPU_PAGE);
	kt_sim_alloc(sim, bufE, 2 * KT_GPU_PAGE, &idE);
	stats(&s0);
	kt_expect(kt_gdr_pin(fd, (uintptr_t)bufE, 2 * KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, &pin),
		  0, "PIN persistent");
	before = c->area->revoke_count;
	kt_expect(kt_sim_free(sim, idE), 0, "nvp2p_sim FREE of persistently pinned memory");
	stats(&s);
	kt_check(s.outstanding_persistent == s0.outstanding_persistent + 1 &&
		 s.allocations == s0.allocations,
		 "sim: persistent pin and its pages still held");
	kt_check(c->area->revoke_count == before && !poll_in(fd, 0), "no revocation, no event");
	kt_expect(kt_gdr_get_pages(fd, pin.handle, pages, 2, &count), 0,
		  "GET_PAGES on the persistent pin after FREE");
	kt_expect(kt_gdr_unpin(fd, pin.handle), 0, "UNPIN persistent");
	stats(&s);
	kt_check(s.outstanding_persistent == s0.outstanding_persistent &&
		 s.allocations == s0.allocations - 1,
		 "sim: the last put released the freed memory");
	return 0;
}

/* Provider faults reach user space with their errno. */
static int case_provider_faults(struct ctx *c)
{
	struct nvp2p_sim_stats s0;
	struct gdrcache_pin pin, pin2;
	uint64_t a = (uintptr_t)c->bufA;
	int fd = c->fd;

	stats(&s0);
	kt_sim_fault(sim, NVP2P_SIM_FAULT_ENOMEM_AFTER,
		     s0.outstanding_pins + s0.outstanding_persistent + 2);
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, &pin), 0, "PIN 1 of 2 allowed");
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, &pin2), 0, "PIN 2 of 2 allowed");
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, NULL), -ENOMEM,
		  "PIN with BAR space exhausted: ENOMEM");
	kt_gdr_unpin(fd, pin.handle);
	kt_gdr_unpin(fd, pin2.handle);
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	kt_sim_fault(sim, NVP2P_SIM_FAULT_EIO_NEXT, 1);
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, NULL), -EIO, "PIN, provider EIO: EIO");
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, &pin), 0, "PIN after the EIO");
	kt_gdr_unpin(fd, pin.handle);
	if (kt_set_param("nvp2p_sim", "enotsupp", "1") == 0) {
		kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, NULL),
			  -EOPNOTSUPP, "PIN persistent, provider ENOTSUPP: EOPNOTSUPP");
		kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, &pin), 0,
			  "PIN callback mode unaffected");
		kt_gdr_unpin(fd, pin.handle);
		kt_set_param("nvp2p_sim", "enotsupp", "2");
		kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, NULL), -EOPNOTSUPP,
			  "PIN callback mode, provider ENOTSUPP: EOPNOTSUPP");
		kt_set_param("nvp2p_sim", "enotsupp", "0");
	} else {
		kt_skip("nvp2p_sim enotsupp parameter not writable");
	}
	return 0;
}

/*
 * Page table versions: 1.2 and later minors (what drivers up to 575 emit), and major 2 (2.0 is
 * what 580.65.06 and later emit: NVIDIA's nv-p2p.h appended a flags field, the fields read here
 * unchanged); 1.1 lacks gpu_uuid, and an unknown major may change them: refused (and put back).
 */
static int case_page_table_versions(struct ctx *c)
{
	struct nvp2p_sim_stats s0, s;
	struct gdrcache_pin pin;
	uint64_t a = (uintptr_t)c->bufA;
	int fd = c->fd;

	if (kt_set_param("nvp2p_sim", "page_table_version", "0x00010002")) {
		kt_skip("nvp2p_sim page_table_version parameter not writable");
		return 0;
	}
	stats(&s0);
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, &pin), 0,
		  "PIN, page table version 1.2: accepted");
	kt_gdr_unpin(fd, pin.handle);
	kt_set_param("nvp2p_sim", "page_table_version", "0x00010003");
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, &pin), 0,
		  "PIN, page table version 1.3: accepted");
	kt_gdr_unpin(fd, pin.handle);
	kt_set_param("nvp2p_sim", "page_table_version", "0x00010001");
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, NULL), -EIO,
		  "PIN, page table version 1.1: EIO");
	kt_set_param("nvp2p_sim", "page_table_version", "0x00020000");
	if (kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, &pin), 0,
		      "PIN, page table version 2.0 (NVIDIA 580.65.06 and later): accepted"))
		kt_gdr_unpin(fd, pin.handle);
	kt_set_param("nvp2p_sim", "page_table_version", "0x00020002");
	if (kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, &pin), 0,
		      "PIN persistent, page table version 2.2: accepted"))
		kt_gdr_unpin(fd, pin.handle);
	kt_set_param("nvp2p_sim", "page_table_version", "0x00000002");
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, 0, NULL), -EIO,
		  "PIN, page table version 0.2: EIO");
	kt_set_param("nvp2p_sim", "page_table_version", "0x00030000");
	kt_expect(kt_gdr_pin(fd, a, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, NULL),
		  -EIO, "PIN persistent, page table version 3.0: EIO");
	kt_set_param("nvp2p_sim", "page_table_version", "0x00010002");
	stats(&s);
	kt_check(s.outstanding_pins == s0.outstanding_pins &&
		 s.outstanding_persistent == s0.outstanding_persistent,
		 "refused page tables were put back");
	return 0;
}

/* max_pinned_bytes. */
static int case_max_pinned_bytes(struct ctx *c)
{
	struct gdrcache_pin pin;

	if (kt_set_param("gdrcache", "max_pinned_bytes", "131072")) {
		kt_skip("gdrcache max_pinned_bytes parameter not writable");
		return 0;
	}
	kt_expect(kt_gdr_pin(c->fd, (uintptr_t)c->bufA, 2 * KT_GPU_PAGE, 0, &pin), 0,
		  "PIN up to max_pinned_bytes");
	kt_expect(kt_gdr_pin(c->fd, (uintptr_t)c->bufA, KT_GPU_PAGE, 0, NULL), -ENOSPC,
		  "PIN beyond max_pinned_bytes: ENOSPC");
	kt_gdr_unpin(c->fd, pin.handle);
	kt_set_param("gdrcache", "max_pinned_bytes", "0");
	return 0;
}

/* Every slot: max_pins pins on one allocation, one more fails; FREE revokes them all. */
static int case_every_slot(struct ctx *c)
{
	const volatile struct gdrcache_revoke_area *area = c->area;
	struct gdrcache_event ev[16];
	struct gdrcache_pin pin;
	uint64_t *h = calloc(c->v.max_pins, sizeof(*h));
	uint64_t before = area->revoke_count, idF;
	char *bufF = kt_gpu_mem(KT_GPU_PAGE);
	uint32_t n, revoked = 0, overflow = 0, in_slot = 0;
	int fd = c->fd, ret, i;

	kt_sim_alloc(sim, bufF, KT_GPU_PAGE, &idF);
	for (n = 0; n < c->v.max_pins; n++) {
		if (kt_gdr_pin(fd, (uintptr_t)bufF, KT_GPU_PAGE, 0, &pin))
			break;
		h[n] = pin.handle;
	}
	kt_check(n == c->v.max_pins, "PIN %u times (max_pins)", n);
	kt_expect(kt_gdr_pin(fd, (uintptr_t)bufF, KT_GPU_PAGE, 0, NULL), -ENOSPC,
		  "PIN beyond max_pins: ENOSPC");
	kt_expect(kt_sim_free(sim, idF), 0, "FREE revokes %u pins", n);
	kt_check(area->revoke_count == before + n, "area: revoke_count +%llu",
		 (unsigned long long)(area->revoke_count - before));
	for (i = 0; i < (int)n; i++)
		in_slot += area->slot[GDRCACHE_HANDLE_SLOT(h[i])] == h[i];
	kt_check(in_slot == n, "area: every handle in its slot (%u)", in_slot);
	while ((ret = kt_read_events(fd, ev, 16)) > 0)
		for (i = 0; i < ret; i++) {
			revoked += ev[i].type == GDRCACHE_EVENT_REVOKED;
			overflow += ev[i].type == GDRCACHE_EVENT_OVERFLOW;
		}
	kt_check(revoked + overflow > 0 && (revoked == n ? !overflow : overflow == 1),
		 "read: %u REVOKED events, %u OVERFLOW", revoked, overflow);
	for (i = 0; i < (int)n; i++)
		if (kt_gdr_unpin(fd, h[i]))
			break;
	kt_check(i == (int)n, "UNPIN every revoked handle");
	free(h);
	return 0;
}

/* close() gives back everything: callback and persistent pins. */
static int case_close_releases(struct ctx *c)
{
	struct nvp2p_sim_stats s0, s;
	int fd2, i;

	stats(&s0);
	fd2 = kt_gdr_open();
	for (i = 0; i < 3; i++)
		kt_gdr_pin(fd2, (uintptr_t)c->bufA, BUF_LEN, 0, NULL);
	for (i = 0; i < 2; i++)
		kt_gdr_pin(fd2, (uintptr_t)c->bufA, BUF_LEN, GDRCACHE_PIN_PERSISTENT, NULL);
	stats(&s);
	kt_check(s.outstanding_pins == s0.outstanding_pins + 3 &&
		 s.outstanding_persistent == s0.outstanding_persistent + 2,
		 "second file holds 3 + 2 pins");
	close(fd2);
	stats(&s);
	kt_check(s.outstanding_pins == s0.outstanding_pins &&
		 s.outstanding_persistent == s0.outstanding_persistent, "close() released them");
	return 0;
}

/* Tidy up; nothing may be left. */
static int case_tidy_up(struct ctx *c)
{
	munmap(c->m, c->v.revoke_area_size);
	close(c->fd);
	kt_sim_free(sim, c->idA);
	kt_sim_free(sim, c->idB);
	kt_sim_free(sim, c->idC);
	kt_sim_expect(sim, 0, 0, 0, "at the end");
	return 0;
}

static const struct {
	const char *name;
	int (*fn)(struct ctx *c);
} cases[] = {
	{ "version", case_version },
	{ "gpu-memory", case_gpu_memory },
	{ "pin-arguments", case_pin_arguments },
	{ "pin", case_pin },
	{ "get-pages", case_get_pages },
	{ "unpin", case_unpin },
	{ "wrong-ioctls", case_wrong_ioctls },
	{ "other-process", case_other_process },
	{ "revoke-area", case_revoke_area },
	{ "revocation", case_revocation },
	{ "blocked-read", case_blocked_read },
	{ "persistent", case_persistent },
	{ "provider-faults", case_provider_faults },
	{ "page-table-versions", case_page_table_versions },
	{ "max-pinned-bytes", case_max_pinned_bytes },
	{ "every-slot", case_every_slot },
	{ "close-releases", case_close_releases },
	{ "tidy-up", case_tidy_up },
};

int main(void)
{
	struct ctx c = { 0 };
	size_t i;
	int ret;

	setvbuf(stdout, NULL, _IOLBF, 0);
	kt_require_devices();
	sim = kt_sim_open();
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	stats(&c.s0);
	kt_diag("sim at start: %llu callback pins, %llu persistent, %llu allocations",
		(unsigned long long)c.s0.outstanding_pins,
		(unsigned long long)c.s0.outstanding_persistent,
		(unsigned long long)c.s0.allocations);
	c.fd = kt_gdr_open();
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ret = cases[i].fn(&c);
		if (ret == STOP)
			break;
		if (ret)
			return ret;
	}
	return kt_done();
}
