// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * gdrcache.ko: a thin misc device around NVIDIA's nvidia_p2p_get_pages() that
 * pins GPU memory for libgdrcache and tells it, without a system call, when the
 * NVIDIA driver revokes a pin (the ABI is include/gdrcache/uapi.h).
 *
 * Locking, outermost first:
 *   gdr_file.lock (mutex)      the handle table, pin counts; never held across
 *                              nvidia_p2p_put_pages*() (unpin claims the
 *                              region under it, puts after dropping it)
 *   gdr_region.lock (spin)     the region's state and page table pointer; the
 *                              only lock NVIDIA's free callback takes ...
 *   gdr_file.ev_lock (spin)    ... besides this one, nested inside it: the
 *                              revocation area and the read() event queue
 *
 * A callback-mode region's page table is given back exactly once, either by
 * the free callback (nvidia_p2p_free_page_table) or by unpin
 * (nvidia_p2p_put_pages); whichever moves the region out of GDR_REGION_PINNED
 * under its lock owns it. put_pages blocks while a callback on that page table
 * runs, so once it returns no callback can touch the region any more.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/fs.h>
#include <linux/kernel.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/poll.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/types.h>
#include <linux/uaccess.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>

#ifdef GDR_USE_NV_P2P_H
#include "nv-p2p.h"
#else
#include "nv_p2p_abi.h"
#endif

#include <gdrcache/uapi.h>

#ifdef NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API
#define GDR_HAVE_PERSISTENT 1
#else
#define GDR_HAVE_PERSISTENT 0
#endif

#define GDR_MAX_PINS_LIMIT	(1U << 20)
#define GDR_READ_BATCH		8

static unsigned int max_pins = 4096;
module_param(max_pins, uint, 0444);
MODULE_PARM_DESC(max_pins,
		 "Most pins one open file may hold = slots in its revocation area (1..1048576, default 4096)");

static unsigned long long max_pinned_bytes;
module_param(max_pinned_bytes, ullong, 0644);
MODULE_PARM_DESC(max_pinned_bytes,
		 "Most bytes one open file may hold pinned, 0 = no limit (default 0)");

static unsigned int event_queue_len = 1024;
module_param(event_queue_len, uint, 0444);
MODULE_PARM_DESC(event_queue_len,
		 "Revocation events queued per open file for read() before an overflow event (default 1024)");

enum gdr_region_state {
	GDR_REGION_PINNED,	/* page table is live: callback or unpin may take it */
	GDR_REGION_REVOKED,	/* the free callback took it: nothing left to put */
	GDR_REGION_UNPINNING,	/* unpin took it and puts it */
};

struct gdr_file;

struct gdr_region {
	struct gdr_file *gf;
	spinlock_t lock;			/* state, pt */
	enum gdr_region_state state;
	struct nvidia_p2p_page_table *pt;
	bool persistent;
	u64 handle;
	u64 va;
	u64 len;
	u32 npages;
	u8 gpu_uuid[16];
	u64 *phys;				/* npages bus addresses, read at pin */
};

/* Marks a slot taken by a PIN that has not finished. */
#define GDR_SLOT_RESERVED ((struct gdr_region *)1)

struct gdr_file {
	/* Who may use this file: identity only, never dereferenced. */
	pid_t owner_tgid;
	const struct mm_struct *owner_mm;

	struct mutex lock;			/* regions, gens, nr_pins, pinned_bytes */
	struct gdr_region **regions;		/* nslots entries */
	u32 *gens;				/* last generation per slot */
	u32 nslots;
	u32 nr_pins;
	u32 next_slot;
	u64 pinned_bytes;

	spinlock_t ev_lock;			/* area stores, ev_* */
	struct gdrcache_revoke_area *area;	/* vmalloc_user, mapped read-only */
	size_t area_size;
	struct gdrcache_event *evq;
	u32 ev_cap;
	u32 ev_head;
	u32 ev_count;
	bool ev_overflowed;
	wait_queue_head_t ev_wait;
};

static bool gdr_is_owner(const struct gdr_file *gf)
{
	return current->tgid == gf->owner_tgid && current->mm == gf->owner_mm;
}

/* Queue one event; caller holds ev_lock. On overflow keep one OVERFLOW event. */
static void gdr_event_push(struct gdr_file *gf, const struct gdr_region *r)
{
	struct gdrcache_event *ev;

	if (gf->ev_overflowed)
		return;
	ev = &gf->evq[(gf->ev_head + gf->ev_count) % gf->ev_cap];
	memset(ev, 0, sizeof(*ev));
	if (gf->ev_count == gf->ev_cap - 1) {
		ev->type = GDRCACHE_EVENT_OVERFLOW;
		gf->ev_overflowed = true;
	} else {
		ev->type = GDRCACHE_EVENT_REVOKED;
		ev->handle = r->handle;
		ev->va = r->va;
		ev->len = r->len;
	}
	gf->ev_count++;
}

/* Make a revocation visible: slot store, then count (release), then event. */
static void gdr_publish_revoke(struct gdr_file *gf, const struct gdr_region *r)
{
	struct gdrcache_revoke_area *area = gf->area;
	unsigned long flags;

	spin_lock_irqsave(&gf->ev_lock, flags);
	WRITE_ONCE(area->slot[GDRCACHE_HANDLE_SLOT(r->handle)], r->handle);
	/* Pairs with the reader's acquire load: a new count implies the slot. */
	smp_store_release(&area->revoke_count, area->revoke_count + 1);
	gdr_event_push(gf, r);
	spin_unlock_irqrestore(&gf->ev_lock, flags);
	wake_up_interruptible(&gf->ev_wait);
}

/*
 * NVIDIA's free callback: the memory behind a callback-mode pin is going away.
 * Runs in the NVIDIA driver's context; takes only the region's lock (and the
 * event lock inside it), never sleeps, never calls put_pages, and leaves the
 * page table alone once it has handed it back.
 */
static void gdr_free_callback(void *data)
{
	struct gdr_region *r = data;
	unsigned long flags;

	spin_lock_irqsave(&r->lock, flags);
	/* In UNPINNING the region is already unlinked: nobody to tell. */
	if (r->state == GDR_REGION_PINNED)
		gdr_publish_revoke(r->gf, r);
	r->state = GDR_REGION_REVOKED;
	nvidia_p2p_free_page_table(r->pt);
	r->pt = NULL;
	spin_unlock_irqrestore(&r->lock, flags);
}

/*
 * Take the region's page table away from the free callback: after this no
 * callback publishes anything for r (so a reused slot keeps its own handle).
 * Returns the page table to put, or NULL if the callback already took it.
 * Called under gf->lock when r is published, before its slot is released.
 */
static struct nvidia_p2p_page_table *gdr_region_claim(struct gdr_region *r)
{
	struct nvidia_p2p_page_table *pt = NULL;
	unsigned long flags;

	spin_lock_irqsave(&r->lock, flags);
	if (r->state == GDR_REGION_PINNED) {
		r->state = GDR_REGION_UNPINNING;
		pt = r->pt;
	}
	spin_unlock_irqrestore(&r->lock, flags);
	return pt;
}

/* Give a claimed page table back to NVIDIA. No lock held. */
static void gdr_region_put_pages(struct gdr_region *r,
				 struct nvidia_p2p_page_table *pt)
{
	unsigned long flags;
	bool revoked;
	int ret;

	if (!pt)
		return;
#if GDR_HAVE_PERSISTENT
	if (r->persistent) {
		ret = nvidia_p2p_put_pages_persistent(r->va, pt, 0);
		if (ret)
			pr_err_ratelimited("put_pages_persistent va 0x%llx: %d\n",
					   r->va, ret);
		return;
	}
#endif
	/* Blocks while a callback on pt runs; after it, none can start. */
	ret = nvidia_p2p_put_pages(0, 0, r->va, pt);
	if (!ret)
		return;
	spin_lock_irqsave(&r->lock, flags);
	revoked = r->state == GDR_REGION_REVOKED;
	spin_unlock_irqrestore(&r->lock, flags);
	/* A callback that raced with us took the page table: expected. */
	if (!revoked)
		pr_err_ratelimited("put_pages va 0x%llx: %d\n", r->va, ret);
}

static void gdr_region_free(struct gdr_region *r)
{
	kvfree(r->phys);
	kfree(r);
}

/* Caller holds gf->lock. Returns the published region of handle, or NULL. */
static struct gdr_region *gdr_lookup(struct gdr_file *gf, u64 handle)
{
	u32 slot = GDRCACHE_HANDLE_SLOT(handle);
	struct gdr_region *r;

	if (slot >= gf->nslots)
		return NULL;
	r = gf->regions[slot];
	if (!r || r == GDR_SLOT_RESERVED || r->handle != handle)
		return NULL;
	return r;
}

/* Take a slot and a handle for r, within the file's limits. */
static int gdr_slot_reserve(struct gdr_file *gf, struct gdr_region *r)
{
	u64 limit = READ_ONCE(max_pinned_bytes);
	u32 i, slot;
	int ret = -ENOSPC;

	mutex_lock(&gf->lock);
	if (gf->nr_pins >= gf->nslots)
		goto out_unlock;
	if (limit && (gf->pinned_bytes + r->len < gf->pinned_bytes ||
		      gf->pinned_bytes + r->len > limit))
		goto out_unlock;
	for (i = 0; i < gf->nslots; i++) {
		slot = (gf->next_slot + i) % gf->nslots;
		if (!gf->regions[slot])
			break;
	}
	if (WARN_ON_ONCE(i == gf->nslots))
		goto out_unlock;
	gf->next_slot = (slot + 1) % gf->nslots;
	if (++gf->gens[slot] == 0)
		gf->gens[slot] = 1;
	r->handle = ((u64)gf->gens[slot] << 32) | slot;
	gf->regions[slot] = GDR_SLOT_RESERVED;
	gf->nr_pins++;
	gf->pinned_bytes += r->len;
	ret = 0;
out_unlock:
	mutex_unlock(&gf->lock);
	return ret;
}

/* Undo gdr_slot_reserve(), or unlink a published region. */
static void gdr_slot_release(struct gdr_file *gf, struct gdr_region *r)
{
	gf->regions[GDRCACHE_HANDLE_SLOT(r->handle)] = NULL;
	gf->nr_pins--;
	gf->pinned_bytes -= r->len;
}

static bool gdr_page_table_ok(const struct nvidia_p2p_page_table *pt)
{
	switch (NVIDIA_P2P_MAJOR_VERSION(pt->version)) {
	case 1:
		/* 1.x before NVIDIA_P2P_PAGE_TABLE_VERSION lacks gpu_uuid. */
		return NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(pt);
	case 2:
		/* Same leading fields as 1.2, per NVIDIA's versioning rules. */
		return true;
	default:
		return false;
	}
}

/*
 * Check a freshly pinned page table and copy what we need out of it, under the
 * region lock so that a callback cannot hand it back meanwhile.
 * Returns 0, -EIO (revoked already, or a page table we do not understand).
 */
static int gdr_region_read_page_table(struct gdr_region *r)
{
	struct nvidia_p2p_page_table *pt;
	unsigned long flags;
	int ret = -EIO;
	u32 i;

	spin_lock_irqsave(&r->lock, flags);
	if (r->state != GDR_REGION_PINNED)
		goto out_unlock;
	pt = r->pt;
	if (!gdr_page_table_ok(pt)) {
		pr_err_ratelimited("page table version 0x%08x not supported\n",
				   pt->version);
		goto out_unlock;
	}
	if (pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB ||
	    pt->entries != r->npages) {
		pr_err_ratelimited("page table: page size %u, %u entries for %u pages\n",
				   pt->page_size, pt->entries, r->npages);
		goto out_unlock;
	}
	for (i = 0; i < r->npages; i++)
		r->phys[i] = pt->pages[i]->physical_address;
	if (pt->gpu_uuid)
		memcpy(r->gpu_uuid, pt->gpu_uuid, sizeof(r->gpu_uuid));
	ret = 0;
out_unlock:
	spin_unlock_irqrestore(&r->lock, flags);
	return ret;
}

static int gdr_get_pages(struct gdr_region *r)
{
	int ret;

	if (r->persistent) {
#if GDR_HAVE_PERSISTENT
		ret = nvidia_p2p_get_pages_persistent(r->va, r->len, &r->pt,
						      NVIDIA_P2P_FLAGS_DEFAULT);
#else
		ret = -EOPNOTSUPP;
#endif
	} else {
		/* The provider stores r->pt before it can call us back. */
		ret = nvidia_p2p_get_pages(0, 0, r->va, r->len, &r->pt,
					   gdr_free_callback, r);
	}
	if (ret == -ENOTSUPP)
		ret = -EOPNOTSUPP;
	return ret;
}

static long gdr_unpin_handle(struct gdr_file *gf, u64 handle)
{
	struct nvidia_p2p_page_table *pt;
	struct gdr_region *r;

	mutex_lock(&gf->lock);
	r = gdr_lookup(gf, handle);
	if (!r) {
		mutex_unlock(&gf->lock);
		return -ENOENT;
	}
	pt = gdr_region_claim(r);
	gdr_slot_release(gf, r);
	mutex_unlock(&gf->lock);

	gdr_region_put_pages(r, pt);
	gdr_region_free(r);
	return 0;
}

static long gdr_ioctl_get_version(struct gdr_file *gf, void __user *uarg)
{
	struct gdrcache_version v;

	if (copy_from_user(&v, uarg, sizeof(v)))
		return -EFAULT;
	if (memchr_inv(v.reserved, 0, sizeof(v.reserved)))
		return -EINVAL;
	memset(&v, 0, sizeof(v));
	v.major = GDRCACHE_UAPI_VERSION_MAJOR;
	v.minor = GDRCACHE_UAPI_VERSION_MINOR;
	v.features = GDRCACHE_FEAT_EVENTS;
	if (GDR_HAVE_PERSISTENT)
		v.features |= GDRCACHE_FEAT_PERSISTENT;
	v.max_pins = gf->nslots;
	v.revoke_area_size = gf->area_size;
	if (copy_to_user(uarg, &v, sizeof(v)))
		return -EFAULT;
	return 0;
}

static long gdr_ioctl_pin(struct gdr_file *gf, void __user *uarg)
{
	struct gdrcache_pin p;
	struct gdr_region *r;
	u64 npages;
	int ret;

	if (copy_from_user(&p, uarg, sizeof(p)))
		return -EFAULT;
	if ((p.flags & ~GDRCACHE_PIN_FLAGS_ALL) || p.reserved0 ||
	    memchr_inv(p.reserved, 0, sizeof(p.reserved)))
		return -EINVAL;
	if (!p.len || !IS_ALIGNED(p.va, GDRCACHE_PAGE_SIZE) ||
	    !IS_ALIGNED(p.len, GDRCACHE_PAGE_SIZE) || p.va + p.len < p.va)
		return -EINVAL;
	npages = p.len >> GDRCACHE_PAGE_SHIFT;
	if (npages > U32_MAX)
		return -EINVAL;
	if ((p.flags & GDRCACHE_PIN_PERSISTENT) && !GDR_HAVE_PERSISTENT)
		return -EOPNOTSUPP;

	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	spin_lock_init(&r->lock);
	r->state = GDR_REGION_PINNED;
	r->gf = gf;
	r->va = p.va;
	r->len = p.len;
	r->npages = npages;
	r->persistent = p.flags & GDRCACHE_PIN_PERSISTENT;
	r->phys = kvmalloc_array(npages, sizeof(*r->phys), GFP_KERNEL);
	if (!r->phys) {
		ret = -ENOMEM;
		goto free_region;
	}

	ret = gdr_slot_reserve(gf, r);
	if (ret)
		goto free_region;

	ret = gdr_get_pages(r);
	if (ret)
		goto release_slot;

	ret = gdr_region_read_page_table(r);
	if (ret) {
		/* Revoked already, or not a page table we understand. */
		gdr_region_put_pages(r, gdr_region_claim(r));
		goto release_slot;
	}

	mutex_lock(&gf->lock);
	gf->regions[GDRCACHE_HANDLE_SLOT(r->handle)] = r;
	mutex_unlock(&gf->lock);

	p.page_size = GDRCACHE_PAGE_SIZE;
	p.handle = r->handle;
	p.page_count = r->npages;
	memcpy(p.gpu_uuid, r->gpu_uuid, sizeof(p.gpu_uuid));
	if (copy_to_user(uarg, &p, sizeof(p))) {
		gdr_unpin_handle(gf, p.handle);
		return -EFAULT;
	}
	return 0;

release_slot:
	mutex_lock(&gf->lock);
	gdr_slot_release(gf, r);
	mutex_unlock(&gf->lock);
free_region:
	gdr_region_free(r);
	return ret;
}

static long gdr_ioctl_unpin(struct gdr_file *gf, void __user *uarg)
{
	struct gdrcache_unpin u;

	if (copy_from_user(&u, uarg, sizeof(u)))
		return -EFAULT;
	if (u.flags || u.reserved0)
		return -EINVAL;
	return gdr_unpin_handle(gf, u.handle);
}

static long gdr_ioctl_get_pages(struct gdr_file *gf, void __user *uarg)
{
	struct gdrcache_get_pages g;
	struct gdr_region *r;
	unsigned long flags;
	long ret = 0;
	u32 n;

	if (copy_from_user(&g, uarg, sizeof(g)))
		return -EFAULT;
	if (g.flags || memchr_inv(g.reserved, 0, sizeof(g.reserved)))
		return -EINVAL;

	mutex_lock(&gf->lock);
	r = gdr_lookup(gf, g.handle);
	if (!r) {
		ret = -ENOENT;
		goto out_unlock;
	}
	spin_lock_irqsave(&r->lock, flags);
	if (r->state == GDR_REGION_REVOKED)
		ret = -EIO;
	spin_unlock_irqrestore(&r->lock, flags);
	if (ret)
		goto out_unlock;
	n = min(g.max_pages, r->npages);
	if (n && copy_to_user(u64_to_user_ptr(g.pages_ptr), r->phys,
			      (size_t)n * sizeof(*r->phys))) {
		ret = -EFAULT;
		goto out_unlock;
	}
	g.page_count = r->npages;
	g.page_size = GDRCACHE_PAGE_SIZE;
out_unlock:
	mutex_unlock(&gf->lock);
	if (!ret && copy_to_user(uarg, &g, sizeof(g)))
		ret = -EFAULT;
	return ret;
}

static long gdr_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct gdr_file *gf = filp->private_data;
	void __user *uarg = (void __user *)arg;

	if (!gdr_is_owner(gf))
		return -EACCES;

	switch (cmd) {
	case GDRCACHE_IOCTL_GET_VERSION:
		return gdr_ioctl_get_version(gf, uarg);
	case GDRCACHE_IOCTL_PIN:
		return gdr_ioctl_pin(gf, uarg);
	case GDRCACHE_IOCTL_UNPIN:
		return gdr_ioctl_unpin(gf, uarg);
	case GDRCACHE_IOCTL_GET_PAGES:
		return gdr_ioctl_get_pages(gf, uarg);
	default:
		return -ENOTTY;
	}
}

static ssize_t gdr_read(struct file *filp, char __user *buf, size_t count,
			loff_t *ppos)
{
	struct gdrcache_event batch[GDR_READ_BATCH];
	struct gdr_file *gf = filp->private_data;
	size_t n, i;
	int ret;

	if (!gdr_is_owner(gf))
		return -EACCES;
	if (count < sizeof(batch[0]))
		return -EINVAL;

	spin_lock_irq(&gf->ev_lock);
	while (!gf->ev_count) {
		spin_unlock_irq(&gf->ev_lock);
		if (filp->f_flags & O_NONBLOCK)
			return -EAGAIN;
		ret = wait_event_interruptible(gf->ev_wait,
					       READ_ONCE(gf->ev_count));
		if (ret)
			return ret;
		spin_lock_irq(&gf->ev_lock);
	}
	n = min3(count / sizeof(batch[0]), (size_t)gf->ev_count,
		 (size_t)GDR_READ_BATCH);
	for (i = 0; i < n; i++) {
		batch[i] = gf->evq[gf->ev_head];
		if (batch[i].type == GDRCACHE_EVENT_OVERFLOW)
			gf->ev_overflowed = false;
		gf->ev_head = (gf->ev_head + 1) % gf->ev_cap;
		gf->ev_count--;
	}
	spin_unlock_irq(&gf->ev_lock);

	/* Events lost to a bad buffer: the area still holds every revocation. */
	if (copy_to_user(buf, batch, n * sizeof(batch[0])))
		return -EFAULT;
	return n * sizeof(batch[0]);
}

static __poll_t gdr_poll(struct file *filp, struct poll_table_struct *wait)
{
	struct gdr_file *gf = filp->private_data;

	if (!gdr_is_owner(gf))
		return EPOLLERR;
	poll_wait(filp, &gf->ev_wait, wait);
	return READ_ONCE(gf->ev_count) ? EPOLLIN | EPOLLRDNORM : 0;
}

static int gdr_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct gdr_file *gf = filp->private_data;

	if (!gdr_is_owner(gf))
		return -EACCES;
	if (vma->vm_pgoff || vma->vm_end - vma->vm_start > gf->area_size)
		return -EINVAL;
	if (vma->vm_flags & VM_WRITE)
		return -EPERM;
#ifdef GDR_HAVE_VM_FLAGS_CLEAR
	vm_flags_clear(vma, VM_MAYWRITE);
#else
	vma->vm_flags &= ~VM_MAYWRITE;
#endif
	return remap_vmalloc_range(vma, gf->area, 0);
}

static int gdr_open(struct inode *inode, struct file *filp)
{
	u32 nslots = clamp(max_pins, 1U, GDR_MAX_PINS_LIMIT);
	u32 ev_cap = clamp(event_queue_len, 2U, GDR_MAX_PINS_LIMIT);
	struct gdr_file *gf;
	int ret = -ENOMEM;

	gf = kzalloc(sizeof(*gf), GFP_KERNEL);
	if (!gf)
		return -ENOMEM;
	gf->owner_tgid = current->tgid;
	gf->owner_mm = current->mm;
	mutex_init(&gf->lock);
	spin_lock_init(&gf->ev_lock);
	init_waitqueue_head(&gf->ev_wait);
	gf->nslots = nslots;
	gf->ev_cap = ev_cap;

	gf->regions = kvcalloc(nslots, sizeof(*gf->regions), GFP_KERNEL);
	if (!gf->regions)
		goto free_file;
	gf->gens = kvcalloc(nslots, sizeof(*gf->gens), GFP_KERNEL);
	if (!gf->gens)
		goto free_regions;
	gf->evq = kvcalloc(ev_cap, sizeof(*gf->evq), GFP_KERNEL);
	if (!gf->evq)
		goto free_gens;
	gf->area_size = PAGE_ALIGN(struct_size(gf->area, slot, nslots));
	gf->area = vmalloc_user(gf->area_size);
	if (!gf->area)
		goto free_evq;
	gf->area->nslots = nslots;

	filp->private_data = gf;
	return nonseekable_open(inode, filp);

free_evq:
	kvfree(gf->evq);
free_gens:
	kvfree(gf->gens);
free_regions:
	kvfree(gf->regions);
free_file:
	kfree(gf);
	return ret;
}

/* Last close (the owner exiting included): give back every pin. */
static int gdr_release(struct inode *inode, struct file *filp)
{
	struct gdr_file *gf = filp->private_data;
	struct nvidia_p2p_page_table *pt = NULL;
	struct gdr_region *r;
	u32 slot;

	for (slot = 0; slot < gf->nslots; slot++) {
		mutex_lock(&gf->lock);
		r = gf->regions[slot];
		if (r && r != GDR_SLOT_RESERVED) {
			pt = gdr_region_claim(r);
			gdr_slot_release(gf, r);
		} else {
			r = NULL;
		}
		mutex_unlock(&gf->lock);
		if (!r)
			continue;
		gdr_region_put_pages(r, pt);
		gdr_region_free(r);
	}
	vfree(gf->area);
	kvfree(gf->evq);
	kvfree(gf->gens);
	kvfree(gf->regions);
	kfree(gf);
	return 0;
}

static const struct file_operations gdr_fops = {
	.owner		= THIS_MODULE,
	.open		= gdr_open,
	.release	= gdr_release,
	.unlocked_ioctl	= gdr_ioctl,
	.compat_ioctl	= compat_ptr_ioctl,
	.read		= gdr_read,
	.poll		= gdr_poll,
	.mmap		= gdr_mmap,
};

static struct miscdevice gdr_misc = {
	.minor	= MISC_DYNAMIC_MINOR,
	.name	= GDRCACHE_DEVICE_NAME,
	.fops	= &gdr_fops,
	.mode	= 0666,
};

static int __init gdr_init(void)
{
	int ret;

	ret = misc_register(&gdr_misc);
	if (ret) {
		pr_err("misc_register: %d\n", ret);
		return ret;
	}
	pr_info("uapi %u.%u, max_pins %u\n", GDRCACHE_UAPI_VERSION_MAJOR,
		GDRCACHE_UAPI_VERSION_MINOR, max_pins);
	return 0;
}

static void __exit gdr_exit(void)
{
	misc_deregister(&gdr_misc);
}

module_init(gdr_init);
module_exit(gdr_exit);

MODULE_DESCRIPTION("GPUDirect RDMA registration cache: pins GPU memory through nvidia_p2p_get_pages");
MODULE_LICENSE("Dual MIT/GPL");
