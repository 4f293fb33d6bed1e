/* SPDX-License-Identifier: MIT */
/* Accessors of a registration handed out by gdr_reg(). */
#include <errno.h>

#include "backend/backend.h"
#include "cache/cache.h"
#include "common/defs.h"
#include "common/log.h"
#include "nic/verbs.h"

static __attribute__((noinline, cold)) bool not_held(const struct gdr_region *r)
{
	gdr_err("region %p is not a held registration", (const void *)r);
	return false;
}

/* A NULL out-pointer given with a held registration. */
static __attribute__((noinline, cold)) int bad_out(const struct gdr_region *r, const char *fn)
{
	gdr_err("%s: NULL out-pointer for region %p", fn, (const void *)r);
	return -EINVAL;
}

/* Inline: middleware asks a registration's keys or MR after every gdr_reg, hit or not. */
static inline __attribute__((always_inline)) bool held(const struct gdr_region *r)
{
	/* A cached record's holds are spread over per-thread counters (thread.c): only its life is
	 * checked here. Records stay readable while their cache lives (record.c). */
	if (__builtin_expect(!r || !gdr_region_aligned(r) || !gdr_rec_cache_checked(r) ||
				     !gdr_region_handed(r) ||
				     (!r->entry && !__atomic_load_n(&r->used, __ATOMIC_RELAXED)),
			     0))
		return not_held(r);
	return true;
}

GDR_EXPORT int gdr_region_mr(const struct gdr_region *r, struct ibv_mr **mr)
{
	if (!held(r))
		return -EINVAL;
	if (!mr)
		return bad_out(r, __func__);
	*mr = r->mr;
	return 0;
}

GDR_EXPORT int gdr_region_keys(const struct gdr_region *r, uint32_t *lkey, uint32_t *rkey)
{
	if (!held(r))
		return -EINVAL;
	if (!r->mr)
		return -ENOENT;
	gdr_mr_keys(r->mr, lkey, rkey);
	return 0;
}

GDR_EXPORT int gdr_region_range(const struct gdr_region *r, uint64_t *base, uint64_t *len)
{
	if (!held(r))
		return -EINVAL;
	if (!base || !len)
		return bad_out(r, __func__);
	if (r->entry) {
		*base = r->entry->pin.base;
		*len = r->entry->pin.len;
	} else {
		gdr_mr_range(r->mr, base, len);
	}
	return 0;
}

GDR_EXPORT int gdr_region_buffer_id(const struct gdr_region *r, uint64_t *buffer_id)
{
	if (!held(r))
		return -EINVAL;
	if (!buffer_id)
		return bad_out(r, __func__);
	*buffer_id = r->buffer_id;
	return 0;
}

GDR_EXPORT int gdr_region_mem_kind(const struct gdr_region *r, enum gdr_mem_kind *kind)
{
	if (!held(r))
		return -EINVAL;
	if (!kind)
		return bad_out(r, __func__);
	*kind = (enum gdr_mem_kind)r->kind;
	return 0;
}

GDR_EXPORT int gdr_region_kmod(const struct gdr_region *r, uint64_t *handle, uint32_t *page_size,
			       uint32_t *page_count)
{
	if (!held(r))
		return -EINVAL;
	if (!r->entry || !r->entry->pin.has_kmod)
		return -ENOENT;
	if (handle)
		*handle = r->entry->pin.kmod_handle;
	if (page_size)
		*page_size = 1u << r->entry->pin.page_shift;
	if (page_count)
		*page_count = r->entry->pin.page_count;
	return 0;
}

GDR_EXPORT int gdr_region_pages(const struct gdr_region *r, uint64_t *pages, uint32_t max)
{
	GDR_KEEP_ERRNO(); /* the kmod backend's ioctl */
	struct gdr_be *b;

	if (!held(r))
		return -EINVAL;
	if (!pages && max)
		return bad_out(r, __func__);
	if (!r->entry)
		return -ENOENT;
	b = r->entry->pin.be;
	return b->ops->pages(b, &r->entry->pin, pages, max);
}

GDR_EXPORT int gdr_region_dmabuf(const struct gdr_region *r, int *fd, uint64_t *offset)
{
	if (!held(r))
		return -EINVAL;
	if (!fd || !offset)
		return bad_out(r, __func__);
	if (!r->entry || !r->entry->pin.has_dmabuf)
		return -ENOENT;
	*fd = r->entry->pin.dmabuf_fd;
	*offset = 0; /* the dma-buf is exported for exactly the pin (gdr_region_range) */
	return 0;
}
