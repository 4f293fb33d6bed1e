/* SPDX-License-Identifier: MIT */
/*
 * UCX's registration cache, ucs_rcache (built when CMake finds Debian's libucx-dev), driven with
 * the same pin callbacks as the other systems (hit_cuda.h). Regions are the requested range
 * aligned to 4 KiB, UCX's own rule; ucs_rcache merges overlapping ones. It has no BUFFER_ID check:
 * it learns of frees from UCM events, which UCX's CUDA memory hooks (ucm/cuda, not in Debian's
 * build) raise on cuMemFree; bench_hit raises the same event, UCM_EVENT_MEM_TYPE_FREE, through
 * ucm_event_dispatch before each free it makes (ucs_freed), and declares the event external so
 * that UCM installs no hooks of its own.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hit_cuda.h"
#include "hit_sys.h"

#ifdef BENCH_HAVE_UCX
#include <sys/mman.h>
#include <ucm/api/ucm.h>
#include <ucs/memory/rcache.h>

/* Exported by libucm (what ucm/cuda's hooks call); not in the public header. */
void ucm_event_enter(void);
void ucm_event_leave(void);
void ucm_event_dispatch(ucm_event_type_t event_type, ucm_event_t *event);

struct ucs_reg {
	ucs_rcache_region_t super;
	int fd;
	uint64_t bytes;     /* pinned (0: the pin failed) */
	uint64_t seq;       /* hit_clock when pinned: ucs_rcache keeps no BUFFER_ID, so bench_hit
			       proves a region fresh by its allocation being older than the pin */
};

struct ucs {
	ucs_rcache_t *rc;
	uint64_t misses, fail_pin, freed;
	uint64_t pinned, peak;  /* bytes pinned now, and at most (does it keep to max_size?) */
};

static ucs_status_t ucs_mem_reg(void *context, ucs_rcache_t *rcache, void *arg,
				ucs_rcache_region_t *region, uint16_t flags)
{
	struct ucs *u = context;
	struct ucs_reg *r = (struct ucs_reg *)region;
	uint64_t start = region->super.start, end = region->super.end;

	(void)rcache;
	(void)arg;
	(void)flags;
	r->seq = hit_clock + 1;
	if (hc_pin(start, end - start, &r->fd)) {
		u->fail_pin++;
		r->fd = -1;
		r->bytes = 0;
		return UCS_ERR_IO_ERROR;
	}
	r->bytes = end - start;
	u->pinned += r->bytes;
	if (u->pinned > u->peak)
		u->peak = u->pinned;
	u->misses++;
	return UCS_OK;
}

static void ucs_mem_dereg(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *region)
{
	(void)rcache;
	((struct ucs *)context)->pinned -= ((struct ucs_reg *)region)->bytes;
	hc_unpin(((struct ucs_reg *)region)->fd);
}

static void ucs_dump_region(void *context, ucs_rcache_t *rcache, ucs_rcache_region_t *region,
			    char *buf, size_t max)
{
	(void)context;
	(void)rcache;
	snprintf(buf, max, "fd %d", ((struct ucs_reg *)region)->fd);
}

static const ucs_rcache_ops_t ucs_ops = {
	.mem_reg = ucs_mem_reg,
	.mem_dereg = ucs_mem_dereg,
	.dump_region = ucs_dump_region,
};

int ucs_open(struct sys *s, const struct sys_limits *lim)
{
	struct ucs *u = calloc(1, sizeof(*u));
	ucs_rcache_params_t prm;
	ucs_status_t st;

	if (!u)
		return -ENOMEM;
	memset(&prm, 0, sizeof(prm));
	prm.region_struct_size = sizeof(struct ucs_reg);
	prm.alignment = 4096;
	prm.max_alignment = 4096;
	prm.ucm_events = UCM_EVENT_MEM_TYPE_FREE;
	prm.ucm_event_priority = 1000;
	prm.ops = &ucs_ops;
	prm.context = u;
	prm.flags = UCS_RCACHE_FLAG_NO_PFN_CHECK;
	prm.max_regions = lim && lim->max_entries ? lim->max_entries : ULONG_MAX;
	prm.max_size = lim && lim->max_bytes ? lim->max_bytes : SIZE_MAX;
	prm.max_unreleased = SIZE_MAX;
	ucm_set_external_event(UCM_EVENT_MEM_TYPE_FREE); /* we raise it: install no hooks */
	st = ucs_rcache_create(&prm, "bench_hit", NULL, &u->rc);
	if (st != UCS_OK) {
		snprintf(s->why, sizeof(s->why), "ucs_rcache_create: %s", ucs_status_string(st));
		free(u);
		return -EIO;
	}
	s->p = u;
	snprintf(s->why, sizeof(s->why),
		 "UCX ucs_rcache (Debian libucx %s), pgtable + rwlock, frees as UCM_EVENT_MEM_TYPE_FREE",
		 BENCH_UCX_VERSION);
	return 0;
}

int ucs_get(void *p, uint64_t addr, size_t len, void **reg)
{
	ucs_rcache_region_t *r;
	ucs_status_t st;

	st = ucs_rcache_get(((struct ucs *)p)->rc, (void *)(uintptr_t)addr, len,
			    PROT_READ | PROT_WRITE, NULL, &r);
	if (st != UCS_OK)
		return -EIO;
	*reg = r;
	return 0;
}

void ucs_put(void *p, void *reg)
{
	ucs_rcache_region_put(((struct ucs *)p)->rc, reg);
}

void ucs_info(void *p, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base, uint64_t *len)
{
	struct ucs_reg *r = reg;

	(void)p;
	*id = 0;
	*seq = r->seq;
	*base = r->super.super.start;
	*len = r->super.super.end - r->super.super.start;
}

void ucs_freed(void *p, uint64_t addr, size_t len)
{
	ucm_event_t ev;

	memset(&ev, 0, sizeof(ev));
	ev.mem_type.address = (void *)(uintptr_t)addr;
	ev.mem_type.size = len;
	ev.mem_type.mem_type = UCS_MEMORY_TYPE_CUDA;
	ucm_event_enter();
	ucm_event_dispatch(UCM_EVENT_MEM_TYPE_FREE, &ev);
	ucm_event_leave();
	((struct ucs *)p)->freed++;
}

uint64_t ucs_misses(void *p)
{
	return ((struct ucs *)p)->misses;
}

uint64_t ucs_pinned(void *p)
{
	return ((struct ucs *)p)->pinned;
}

void ucs_describe(void *p, char *buf, size_t len)
{
	struct ucs *u = p;

	snprintf(buf, len, "pins %" PRIu64 ", failed pins %" PRIu64 ", free events raised %" PRIu64
		 ", pinned %" PRIu64 " MiB (peak %" PRIu64 " MiB)", u->misses, u->fail_pin, u->freed,
		 u->pinned >> 20, u->peak >> 20);
}

void ucs_close(void *p)
{
	struct ucs *u = p;

	ucs_rcache_destroy(u->rc);
	free(u);
}

#else /* !BENCH_HAVE_UCX */

int ucs_open(struct sys *s, const struct sys_limits *lim)
{
	(void)lim;
	snprintf(s->why, sizeof(s->why), "not built: libucx-dev (ucs/memory/rcache.h) not found");
	return -ENOSYS;
}

int ucs_get(void *p, uint64_t addr, size_t len, void **reg) { return -ENOSYS; }
void ucs_put(void *p, void *reg) {}
void ucs_close(void *p) {}
void ucs_info(void *p, void *reg, uint64_t *id, uint64_t *seq, uint64_t *base, uint64_t *len) {}
void ucs_freed(void *p, uint64_t addr, size_t len) {}
uint64_t ucs_misses(void *p) { return 0; }
uint64_t ucs_pinned(void *p) { return 0; }
void ucs_describe(void *p, char *buf, size_t len) { snprintf(buf, len, "not built"); }

#endif
