/* SPDX-License-Identifier: MIT */
/*
 * SIMULATION of a pinning backend for unit tests. It pins nothing; it records, for every 64 KiB page
 * of each pin, the physical generation the fake CUDA driver reports for it (fake_cuda_phys_gen), so
 * a test can prove that a registration still maps the memory now at its addresses. Like the real
 * nvidia_p2p_get_pages it refuses ranges CUDA does not back, and it injects -ENOMEM / -ENOSPC (BAR
 * exhaustion) and arbitrary errors.
 */
#include <errno.h>
#include <stdlib.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <uthash.h>
#include <utlist.h>

#include "fake_cuda.h"
#include "fakes.h"
#include "cache/cache.h" /* what a registration pinned (white box) */

struct fake_backend_state fake_be;

struct fake_pin {
	uint64_t handle;               /* unique: two live pins may share a base */
	uint64_t base, len;
	uint64_t *gen;                 /* per 64 KiB page */
	struct fake_pin *prev, *next;
};

struct page_count {
	uint64_t page;
	unsigned n;
	UT_hash_handle hh;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_pin *pins;
static struct page_count *pages;
static uint64_t next_handle = 1;

void fake_backend_reset(void)
{
	pthread_mutex_lock(&lock);
	memset(&fake_be, 0, sizeof(fake_be));
	pthread_mutex_unlock(&lock);
}

static void page_ref(uint64_t page, int delta)
{
	struct page_count *p;

	HASH_FIND(hh, pages, &page, sizeof(page), p);
	if (!p) {
		p = calloc(1, sizeof(*p));
		p->page = page;
		HASH_ADD(hh, pages, page, sizeof(p->page), p);
	}
	if (delta > 0 && p->n == 1)
		fake_be.double_pinned_now++;
	if (delta < 0 && p->n == 2)
		fake_be.double_pinned_now--;
	p->n += delta;
	if (!p->n) {
		HASH_DEL(pages, p);
		free(p);
	}
}

struct fake_be_handle {
	struct gdr_be base;
};

static int fb_open(const struct gdr_config *cfg, const struct gdr_sys *sys, struct gdr_be **out,
		   const char **why)
{
	struct fake_be_handle *h = calloc(1, sizeof(*h));

	(void)cfg;
	h->base.ops = &fake_backend_ops;
	h->base.sys = *sys;
	*out = &h->base;
	*why = "test double";
	return 0;
}

static void fb_close(struct gdr_be *b)
{
	free(b);
}

static int fb_pin(struct gdr_be *b, struct gdr_pin *pin)
{
	uint64_t npages = pin->len / GDR_GPU_PAGE;
	struct fake_pin *p;
	int rc = 0;

	(void)b;
	if (pin->base % GDR_GPU_PAGE || pin->len % GDR_GPU_PAGE || !pin->len)
		return -EINVAL;
	pthread_mutex_lock(&lock);
	if (fake_be.fail_next_n) {
		fake_be.fail_next_n--;
		rc = fake_be.fail_next_rc;
		goto out;
	}
	if (fake_be.enomem_after && fake_be.outstanding >= fake_be.enomem_after) {
		rc = -ENOMEM;
		goto out;
	}
	if (fake_be.bar_bytes && fake_be.outstanding_bytes + pin->len > fake_be.bar_bytes) {
		rc = -ENOSPC;
		goto out;
	}
	p = calloc(1, sizeof(*p));
	p->gen = calloc(npages, sizeof(*p->gen));
	p->handle = next_handle++;
	p->base = pin->base;
	p->len = pin->len;
	for (uint64_t i = 0; i < npages; i++) {
		p->gen[i] = fake_cuda_phys_gen(pin->base + i * GDR_GPU_PAGE);
		if (!p->gen[i]) {
			/* nvidia_p2p_get_pages fails on a range with no GPU memory behind it */
			fake_be.bad_pins++;
			free(p->gen);
			free(p);
			rc = -EINVAL;
			goto out;
		}
	}
	/* Newest first: two live pins at one base happen only while a detached entry is held. */
	DL_PREPEND(pins, p);
	for (uint64_t i = 0; i < npages; i++)
		page_ref(pin->base / GDR_GPU_PAGE + i, 1);
	fake_be.pins++;
	fake_be.outstanding++;
	fake_be.outstanding_bytes += pin->len;
	if (fake_be.outstanding_bytes > fake_be.max_outstanding_bytes)
		fake_be.max_outstanding_bytes = fake_be.outstanding_bytes;
	pin->kmod_handle = p->handle;
	pin->page_shift = (uint8_t)__builtin_ctz(GDR_GPU_PAGE);
	pin->page_count = (uint32_t)npages;
out:
	pthread_mutex_unlock(&lock);
	return rc;
}

static void fb_unpin(struct gdr_be *b, struct gdr_pin *pin)
{
	struct fake_pin *p;

	(void)b;
	pthread_mutex_lock(&lock);
	DL_FOREACH(pins, p)
		if (p->handle == pin->kmod_handle)
			break;
	if (p) {
		DL_DELETE(pins, p);
		free(p->gen);
		free(p);
	}
	for (uint64_t i = 0; i < pin->len / GDR_GPU_PAGE; i++)
		page_ref(pin->base / GDR_GPU_PAGE + i, -1);
	fake_be.unpins++;
	fake_be.outstanding--;
	fake_be.outstanding_bytes -= pin->len;
	pthread_mutex_unlock(&lock);
}

bool fake_backend_pin_current(const struct gdr_region *r, uint64_t a, uint64_t len)
{
	struct fake_pin *p;
	bool ok = true;

	pthread_mutex_lock(&lock);
	DL_FOREACH(pins, p)
		if (r->entry && p->handle == r->entry->pin.kmod_handle)
			break;
	if (!p || a < p->base || a + len > p->base + p->len) {
		ok = false;
	} else {
		for (uint64_t pg = GDR_ALIGN_DOWN(a); pg < a + len; pg += GDR_GPU_PAGE)
			if (p->gen[(pg - p->base) / GDR_GPU_PAGE] != fake_cuda_phys_gen(pg))
				ok = false;
	}
	pthread_mutex_unlock(&lock);
	return ok;
}

static int fb_reg_mr(struct gdr_be *b, const struct gdr_pin *pin, struct ibv_pd *pd, int access,
		     uint64_t base, uint64_t len, struct ibv_mr **mr)
{
	(void)pin;
	return gdr_verbs_reg(b->sys.verbs, pd, (void *)(uintptr_t)base, len, base, access, mr);
}

static int fb_pages(struct gdr_be *b, const struct gdr_pin *pin, uint64_t *out, uint32_t max)
{
	(void)b;
	for (uint32_t i = 0; i < pin->page_count && i < max; i++)
		out[i] = pin->base + (uint64_t)i * GDR_GPU_PAGE; /* identity "bus addresses" */
	return (int)pin->page_count;
}

const struct gdr_backend_ops fake_backend_ops = {
	.name = "fake",
	.id = GDR_BACKEND_KMOD,
	.open = fb_open,
	.close = fb_close,
	.pin = fb_pin,
	.unpin = fb_unpin,
	.reg_mr = fb_reg_mr,
	.pages = fb_pages,
	.pins_without_pd = true,
};

