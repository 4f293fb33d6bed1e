/* SPDX-License-Identifier: MIT */
/*
 * Backend "kmod": pins through gdrcache.ko (/dev/gdrcache, include/gdrcache/uapi.h), which wraps
 * nvidia_p2p_get_pages. Gives a page list for third-party devices and, with a PD, an MR made by
 * ibv_reg_mr on the GPU VA (which the NIC driver resolves through nvidia-peermem on real systems).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "gdrcache/uapi.h"
#include "backend/backend.h"
#include "common/config.h"
#include "common/log.h"
#include "nic/verbs.h"

struct kmod_backend {
	struct gdr_be base;
	int fd;
	struct gdrcache_version ver;
	const struct gdrcache_revoke_area *area; /* read-only; NULL without GDRCACHE_FEAT_EVENTS */
};

static int sys_open(const char *path, int flags)
{
	int fd = open(path, flags);

	return fd < 0 ? -errno : fd;
}

static int sys_close(int fd)
{
	return close(fd) ? -errno : 0;
}

static int sys_ioctl(int fd, unsigned long req, void *arg)
{
	return ioctl(fd, req, arg) < 0 ? -errno : 0;
}

static void *sys_mmap(size_t len, int fd)
{
	void *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);

	return p == MAP_FAILED ? NULL : p;
}

static int sys_munmap(void *addr, size_t len)
{
	return munmap(addr, len) ? -errno : 0;
}

const struct gdr_kmod_sys gdr_kmod_sys_libc = {
	.open = sys_open,
	.close = sys_close,
	.ioctl = sys_ioctl,
	.mmap = sys_mmap,
	.munmap = sys_munmap,
};

static struct kmod_backend *to_kmod(struct gdr_be *b)
{
	return (struct kmod_backend *)b;
}

#define REASON_LEN 512

static int kmod_open(const struct gdr_config *cfg, const struct gdr_sys *sys, struct gdr_be **out,
		     const char **why)
{
	const struct gdr_kmod_sys *ks = sys->kmod;
	/* Not thread-local: a library that is dlopen'ed has little static TLS to draw on (glibc
	 * reserves about 1.5 KiB for every such library together; 512 bytes here made dlopen fail
	 * with "cannot allocate memory in static TLS block" where others had taken some). One
	 * buffer a call, from a small ring: the caller logs *why at once. */
	static char reasons[8][REASON_LEN];
	static unsigned next_reason;
	char *reason = reasons[__atomic_fetch_add(&next_reason, 1, __ATOMIC_RELAXED) % 8];
	struct kmod_backend *k;
	int fd;

	fd = ks->open(cfg->kmod_dev, O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		snprintf(reason, REASON_LEN, "cannot open %s: %s", cfg->kmod_dev,
			 gdr_strerror(-fd));
		*why = reason;
		return -ENODEV;
	}
	k = calloc(1, sizeof(*k));
	if (!k) {
		ks->close(fd);
		*why = "out of memory";
		return -ENOMEM;
	}
	k->base.ops = &gdr_backend_kmod_ops;
	k->base.sys = *sys;
	k->fd = fd;
	if (ks->ioctl(fd, GDRCACHE_IOCTL_GET_VERSION, &k->ver) ||
	    k->ver.major != GDRCACHE_UAPI_VERSION_MAJOR) {
		snprintf(reason, REASON_LEN, "%s speaks ABI %u.%u, the library %u.%u",
			 cfg->kmod_dev, k->ver.major, k->ver.minor, GDRCACHE_UAPI_VERSION_MAJOR,
			 GDRCACHE_UAPI_VERSION_MINOR);
		*why = reason;
		goto err_close;
	}
	if (k->ver.features & GDRCACHE_FEAT_EVENTS) {
		k->area = ks->mmap(k->ver.revoke_area_size, fd);
		if (!k->area)
			gdr_warn("cannot map %s's revocation area: kernel events unused",
				 cfg->kmod_dev);
	}
	snprintf(reason, REASON_LEN, "%s opened, module ABI %u.%u", cfg->kmod_dev, k->ver.major,
		 k->ver.minor);
	*why = reason;
	*out = &k->base;
	return 0;

err_close:
	ks->close(fd);
	free(k);
	return -ENODEV;
}

static void kmod_close(struct gdr_be *b)
{
	struct kmod_backend *k = to_kmod(b);

	if (k->area)
		k->base.sys.kmod->munmap((void *)k->area, k->ver.revoke_area_size);
	k->base.sys.kmod->close(k->fd); /* the module releases whatever is still pinned */
	free(k);
}

static void kmod_unpin(struct gdr_be *b, struct gdr_pin *pin);

static int kmod_pin(struct gdr_be *b, struct gdr_pin *pin)
{
	struct gdrcache_pin p = { .va = pin->base, .len = pin->len };
	int rc = b->sys.kmod->ioctl(to_kmod(b)->fd, GDRCACHE_IOCTL_PIN, &p);

	if (rc)
		return rc;
	pin->has_kmod = true;
	pin->kmod_handle = p.handle;
	if (!p.page_size || (p.page_size & (p.page_size - 1))) { /* the module's are 4 or 64 KiB */
		gdr_err("gdrcache.ko pinned [%#llx, +%llu) in pages of %u bytes, not a power of two",
			(unsigned long long)pin->base, (unsigned long long)pin->len, p.page_size);
		kmod_unpin(b, pin);
		return -EIO;
	}
	pin->page_shift = (uint8_t)__builtin_ctz(p.page_size);
	pin->page_count = p.page_count;
	gdr_dbg("kmod_pin range=%#llx-%#llx handle=%#llx page_size=%u pages=%u",
		(unsigned long long)pin->base, (unsigned long long)(pin->base + pin->len),
		(unsigned long long)p.handle, p.page_size, p.page_count);
	return 0;
}

static void kmod_unpin(struct gdr_be *b, struct gdr_pin *pin)
{
	struct gdrcache_unpin u = { .handle = pin->kmod_handle };
	int rc = b->sys.kmod->ioctl(to_kmod(b)->fd, GDRCACHE_IOCTL_UNPIN, &u);

	if (rc)
		gdr_err("unpin of handle %#llx failed: %d", (unsigned long long)u.handle, rc);
	pin->has_kmod = false;
}

static int kmod_reg_mr(struct gdr_be *b, const struct gdr_pin *pin, struct ibv_pd *pd, int access,
		       uint64_t base, uint64_t len, struct ibv_mr **mr)
{
	(void)pin;
	return gdr_verbs_reg(b->sys.verbs, pd, (void *)(uintptr_t)base, len, base, access, mr);
}

static int kmod_pages(struct gdr_be *b, const struct gdr_pin *pin, uint64_t *pages, uint32_t max)
{
	struct gdrcache_get_pages g = {
		.handle = pin->kmod_handle,
		.pages_ptr = (uintptr_t)pages,
		.max_pages = max,
	};
	int rc = b->sys.kmod->ioctl(to_kmod(b)->fd, GDRCACHE_IOCTL_GET_PAGES, &g);

	return rc ? rc : (int)g.page_count;
}

/* The module stores a revoked handle into its slot of the shared area (uapi.h). */
static bool kmod_revoked(struct gdr_be *b, const struct gdr_pin *pin)
{
	const struct kmod_backend *k = to_kmod(b);
	uint32_t slot = GDRCACHE_HANDLE_SLOT(pin->kmod_handle);

	if (!k->area || !pin->has_kmod || slot >= k->area->nslots)
		return false;
	return __atomic_load_n(&k->area->slot[slot], __ATOMIC_ACQUIRE) == pin->kmod_handle;
}

const struct gdr_backend_ops gdr_backend_kmod_ops = {
	.name = "kmod",
	.id = GDR_BACKEND_KMOD,
	.open = kmod_open,
	.close = kmod_close,
	.pin = kmod_pin,
	.unpin = kmod_unpin,
	.reg_mr = kmod_reg_mr,
	.pages = kmod_pages,
	.revoked = kmod_revoked,
	.revokes = true,
	.pins_without_pd = true,
};
