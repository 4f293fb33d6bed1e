/* SPDX-License-Identifier: MIT */
/*
 * SIMULATION of gdrcache.ko's system calls for unit tests of lib/backend/kmod.c (the module itself is
 * proven in the VM: tests/vm). It checks requests the way the module's ABI says it does (alignment,
 * unknown flags, reserved fields) and counts the malformed ones, so a test proves the library never
 * sends one.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"
#include "fakes.h"
#include "gdrcache/uapi.h"

struct fake_kmod_state fake_kmod = { .present = true, .major = GDRCACHE_UAPI_VERSION_MAJOR };

#define FAKE_FD 4242
#define NSLOTS 1024
static struct {
	uint64_t handle, va, len;
} slots[NSLOTS];
static uint32_t gen = 1;
static void *area;

static int k_open(const char *path, int flags)
{
	(void)path, (void)flags;
	if (!fake_kmod.present)
		return -ENOENT;
	fake_kmod.closed = false;
	return FAKE_FD;
}

static int k_close(int fd)
{
	if (fd != FAKE_FD)
		return -EBADF;
	memset(slots, 0, sizeof(slots)); /* closing releases every pin */
	fake_kmod.outstanding = 0;
	fake_kmod.closed = true;
	return 0;
}

static bool nonzero(const void *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (((const unsigned char *)p)[i])
			return true;
	return false;
}

static int find(uint64_t h)
{
	uint32_t s = GDRCACHE_HANDLE_SLOT(h);

	return s < NSLOTS && slots[s].handle == h && h ? (int)s : -1;
}

static int k_ioctl(int fd, unsigned long req, void *arg)
{
	if (fd != FAKE_FD)
		return -EBADF;
	switch (req) {
	case GDRCACHE_IOCTL_GET_VERSION: {
		struct gdrcache_version *v = arg;

		if (nonzero(v, sizeof(*v))) {
			fake_kmod.ioctls_bad++;
			return -EINVAL;
		}
		v->major = fake_kmod.major;
		v->minor = 0;
		v->features = GDRCACHE_FEAT_EVENTS | GDRCACHE_FEAT_PERSISTENT;
		v->max_pins = NSLOTS;
		v->revoke_area_size = 64 + NSLOTS * 8;
		return 0;
	}
	case GDRCACHE_IOCTL_PIN: {
		struct gdrcache_pin *p = arg;
		int s;

		if (p->flags & ~GDRCACHE_PIN_FLAGS_ALL || p->reserved0 ||
		    nonzero(p->reserved, sizeof(p->reserved)) || p->va % GDRCACHE_PAGE_SIZE ||
		    p->len % GDRCACHE_PAGE_SIZE || !p->len || p->va + p->len < p->va) {
			fake_kmod.ioctls_bad++;
			return -EINVAL;
		}
		if (fake_kmod.pin_fail_n) {
			fake_kmod.pin_fail_n--;
			return fake_kmod.pin_fail_rc;
		}
		for (uint64_t a = p->va; a < p->va + p->len; a += GDRCACHE_PAGE_SIZE)
			if (!fake_cuda_phys_gen(a))
				return -EINVAL;
		for (s = 0; s < NSLOTS && slots[s].handle; s++)
			;
		if (s == NSLOTS)
			return -ENOSPC;
		slots[s].handle = ((uint64_t)gen++ << 32) | (uint32_t)s;
		slots[s].va = p->va;
		slots[s].len = p->len;
		p->handle = slots[s].handle;
		p->page_size = GDRCACHE_PAGE_SIZE;
		p->page_count = (uint32_t)(p->len / GDRCACHE_PAGE_SIZE);
		memset(p->gpu_uuid, 0xab, sizeof(p->gpu_uuid));
		fake_kmod.outstanding++;
		return 0;
	}
	case GDRCACHE_IOCTL_UNPIN: {
		struct gdrcache_unpin *u = arg;
		int s;

		if (u->flags || u->reserved0) {
			fake_kmod.ioctls_bad++;
			return -EINVAL;
		}
		s = find(u->handle);
		if (s < 0)
			return -ENOENT;
		memset(&slots[s], 0, sizeof(slots[s]));
		fake_kmod.outstanding--;
		return 0;
	}
	case GDRCACHE_IOCTL_GET_PAGES: {
		struct gdrcache_get_pages *g = arg;
		uint64_t *out = (uint64_t *)(uintptr_t)g->pages_ptr;
		int s;

		if (g->flags || nonzero(g->reserved, sizeof(g->reserved))) {
			fake_kmod.ioctls_bad++;
			return -EINVAL;
		}
		s = find(g->handle);
		if (s < 0)
			return -ENOENT;
		g->page_size = GDRCACHE_PAGE_SIZE;
		g->page_count = (uint32_t)(slots[s].len / GDRCACHE_PAGE_SIZE);
		for (uint32_t i = 0; i < g->page_count && i < g->max_pages; i++)
			out[i] = 0x100000000000ULL + slots[s].va + (uint64_t)i * GDRCACHE_PAGE_SIZE;
		return 0;
	}
	default:
		return -ENOTTY;
	}
}

static void *k_mmap(size_t len, int fd)
{
	if (fd != FAKE_FD)
		return NULL;
	area = calloc(1, len);
	((struct gdrcache_revoke_area *)area)->nslots = NSLOTS;
	return area;
}

/* What the module's free callback does when the driver frees the memory under a pin. */
int fake_kmod_revoke(uint64_t va)
{
	struct gdrcache_revoke_area *ra = area;
	int n = 0;

	for (int s = 0; s < NSLOTS && ra; s++) {
		if (slots[s].handle && slots[s].va <= va && va < slots[s].va + slots[s].len) {
			__atomic_store_n(&ra->slot[s], slots[s].handle, __ATOMIC_RELEASE);
			__atomic_fetch_add(&ra->revoke_count, 1, __ATOMIC_RELEASE);
			n++;
		}
	}
	return n;
}

static int k_munmap(void *addr, size_t len)
{
	(void)len;
	if (addr != area)
		return -EINVAL;
	free(area);
	area = NULL;
	return 0;
}

static const struct gdr_kmod_sys fake_sys = {
	.open = k_open,
	.close = k_close,
	.ioctl = k_ioctl,
	.mmap = k_mmap,
	.munmap = k_munmap,
};

void fake_kmod_install(void)
{
	fake_seams.kmod = &fake_sys;
}
