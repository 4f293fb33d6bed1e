// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * gdrcache.ko: a thin misc device around NVIDIA's nvidia_p2p_get_pages() that
 * pins GPU memory for libgdrcache and tells it, without a system call, when the
 * NVIDIA driver revokes a pin (the ABI is include/gdrcache/uapi.h).
 *
 * Ownership. A file belongs to the process image that opened it: its
 * thread-group id, the group leader's start time and its exec count, which
 * together never repeat (no reference is held: every helper that would drop
 * one, __mmdrop, put_pid, __put_task_struct, is GPL-only). The owner's close()
 * of any descriptor of the file, or its exit, ends the file: every pin is given
 * back at once, whoever else still holds the file (a forked child, an
 * SCM_RIGHTS receiver, a mapping), and every later call fails. The owner's
 * exit does not close a descriptor table that a clone(CLONE_FILES) sibling
 * still shares, so open() also maps one page of the file into the opener (the
 * anchor): the owner's address space is torn down in the owner's own context
 * when it exits or execs, whoever shares its descriptors, and the anchor's
 * close ends the file there.
 *
 * Locking, outermost first:
 *   mmap_lock of a dying mm    held around the anchor's close, which ends the
 *                              file (nothing of ours takes an mmap_lock while
 *                              holding a lock of ours)
 *   gdr_proc.lock (mutex)      one owner's orphans; its put_pages run under it
 *   gdr_persist_lock (mutex)   persistent orphans, the retry worker's
 *   gdr_file.lock (mutex)      the handle table, generations, per-file counts,
 *                              dead; never held across nvidia_p2p_put_pages*()
 *                              or copy_to_user()
 *   gdr_acct_lock (spin)       per-user and global counts, gdr_nr_orphans
 *   gdr_procs_lock (spin)      the owners' table and their reference counts
 *   gdr_region.lock (spin)     the region's state and page table pointer; the
 *                              only lock NVIDIA's free callback takes ...
 *   gdr_file.ev_lock (spin)    ... besides this one, nested inside it: the
 *   gdr_reap_lock (spin)       revocation area and the read() event queue;
 *                              and the revoked orphans waiting for the reaper
 *                              (taken after r->lock is dropped)
 *
 * No ioctl takes a lock shared by all users' orphans: each owner process has
 * its own orphan list (struct gdr_proc, reached from the file in constant
 * time), its ioctls put back at most GDR_ORPHAN_BATCH of them, and a free
 * callback hands a revoked orphan to the reaper through gdr_reap_lock.
 *
 * A callback-mode page table is given back exactly once: by the free callback,
 * or by nvidia_p2p_put_pages() from whoever moved the region out of
 * GDR_REGION_PINNED under its lock. put_pages blocks while a callback on that
 * page table runs (both hold NVIDIA's RM API lock), so once it has returned no
 * callback can come; it returns 0 also when the callback took the table.
 * NVIDIA finds a callback-mode table only among the RM clients of the calling
 * process (RmP2PPutPages() looks up current->tgid): from any other process or
 * a kworker, put_pages returns 0 and releases nothing. So callback-mode tables
 * are put only in their owner's process (its ioctls and close). If put fails
 * (the open driver returns -ENOMEM when it cannot allocate its stack), the
 * region becomes an orphan: it keeps its memory, its charge and a reference on
 * this module until the callback takes the page table or the owner's next
 * call puts it again, so neither a late callback nor the module's unload can
 * meet freed memory. Persistent tables are found by NVIDIA's own object, from
 * any context: their orphans are retried every GDR_RETRY_DELAY by a worker.
 *
 * The free callback holds a module reference of its own while it runs, and
 * drops it with a tail call: module_put() returns straight to NVIDIA, so no
 * instruction of this module runs once the reference that kept it loaded is
 * gone (the kernel's module_put_and_kthread_exit() idea, for a function that
 * must return; tests/kmod/kmod_tail_check.c checks the object code).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cred.h>
#include <linux/fs.h>
#include <linux/hashtable.h>
#include <linux/kernel.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/mman.h>
#include <linux/mmap_lock.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/overflow.h>
#include <linux/poll.h>
#include <linux/refcount.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/types.h>
#include <linux/uaccess.h>
#include <linux/uidgid.h>
#include <linux/user_namespace.h>
#include <linux/vmalloc.h>
#include <linux/wait.h>
#include <linux/workqueue.h>

#ifdef GDR_USE_NV_P2P_H
#include "nv-p2p.h"
/* nv-p2p.h of 535 and older has no flag names; its persistent calls take 0 (else -EINVAL). */
#ifndef NVIDIA_P2P_FLAGS_DEFAULT
#define NVIDIA_P2P_FLAGS_DEFAULT 0
#endif
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
#define GDR_MAX_EVENTS_LIMIT	(1U << 16)
#define GDR_READ_BATCH		8
/* Longest pin: 2^24 GPU pages, a 128 MiB page array at most. */
#define GDR_MAX_PIN_LEN		(1ULL << 40)
/* Page table entries copied per hold of the region lock. */
#define GDR_COPY_CHUNK		4096
#define GDR_RETRY_DELAY		HZ
/* Orphans one ioctl of their owner puts back; the rest wait for its next call. */
#define GDR_ORPHAN_BATCH	64

static unsigned int max_pins = 4096;
module_param(max_pins, uint, 0444);
MODULE_PARM_DESC(max_pins,
		 "Most pins one open file may hold = slots in its revocation area (1..1048576, default 4096)");

static unsigned long long max_pinned_bytes;
module_param(max_pinned_bytes, ullong, 0644);
MODULE_PARM_DESC(max_pinned_bytes,
		 "Most bytes one open file may hold pinned, 0 = no limit (default 0)");

static unsigned long long max_user_pins = 65536;
module_param(max_user_pins, ullong, 0644);
MODULE_PARM_DESC(max_user_pins,
		 "Most pins one user (real uid; in a user namespace, its creator's) may hold over all files, 0 = no limit (default 65536); beyond: EDQUOT");

static unsigned long long max_user_pinned_bytes = 1ULL << 42;
module_param(max_user_pinned_bytes, ullong, 0644);
MODULE_PARM_DESC(max_user_pinned_bytes,
		 "Most bytes one user may hold pinned over all files, 0 = no limit (default 4 TiB); beyond: EDQUOT");

static unsigned long long max_total_pins = 262144;
module_param(max_total_pins, ullong, 0644);
MODULE_PARM_DESC(max_total_pins,
		 "Most pins all users together may hold, 0 = no limit (default 262144); beyond: ENOSPC");

static unsigned long long max_total_pinned_bytes = 1ULL << 44;
module_param(max_total_pinned_bytes, ullong, 0644);
MODULE_PARM_DESC(max_total_pinned_bytes,
		 "Most bytes all users together may hold pinned, 0 = no limit (default 16 TiB); beyond: ENOSPC");

static unsigned int event_queue_len = 1024;
module_param(event_queue_len, uint, 0444);
MODULE_PARM_DESC(event_queue_len,
		 "Revocation events queued per open file for read() before an overflow event (2..65536, default 1024)");

/* Pins and pinned bytes of all users now (under gdr_acct_lock; read-only parameters, read
 * without it: gdrcache_info reports them). */
static u64 gdr_total_pins;
module_param_named(pins, gdr_total_pins, ullong, 0444);
MODULE_PARM_DESC(pins, "GPU pins held now, all users (read-only)");
static u64 gdr_total_bytes;
module_param_named(pinned_bytes, gdr_total_bytes, ullong, 0444);
MODULE_PARM_DESC(pinned_bytes, "GPU bytes pinned now, all users (read-only)");

static unsigned int gdr_nr_orphans;
module_param_named(orphans, gdr_nr_orphans, uint, 0444);
MODULE_PARM_DESC(orphans,
		 "Pins whose put_pages failed, kept until NVIDIA's callback or a retry gives them back (read-only)");

enum gdr_region_state {
	GDR_REGION_PINNED,	/* page table is live: callback or a claim may take it */
	GDR_REGION_PUTTING,	/* claimed: put_pages is being called */
	GDR_REGION_ORPHANED,	/* put_pages failed: on the orphan list */
	GDR_REGION_REVOKED,	/* the free callback took it: nothing left to put */
};

/* Pins and bytes of one user, over all files; also what orphans still hold. */
struct gdr_user {
	struct hlist_node node;		/* gdr_users */
	kuid_t uid;
	unsigned int refs;		/* open files and charged regions */
	u64 pins;
	u64 bytes;
};

static DEFINE_SPINLOCK(gdr_acct_lock);	/* gdr_users, every gdr_user, totals */
static DEFINE_HASHTABLE(gdr_users, 6);

/* Who may use a file: identity only, nothing dereferenced or referenced. */
struct gdr_owner {
	pid_t tgid;
	u64 start_time;		/* of the group leader: a reused tgid has a later one */
	u64 exec_id;		/* self_exec_id: bumped by every execve */
};

/*
 * One owner process (tgid and group leader's start time: what NVIDIA's put
 * needs, whatever it exec'ed since) and its callback-mode orphans. Shared by
 * the owner's files, each of which holds a reference, as does each orphan.
 */
struct gdr_proc {
	struct hlist_node node;			/* gdr_procs */
	pid_t tgid;
	u64 start_time;
	unsigned int refs;			/* under gdr_procs_lock */
	struct mutex lock;			/* orphans, nr_orphans */
	struct list_head orphans;		/* gdr_region.orphan_node */
	unsigned int nr_orphans;		/* read without the lock: 0 = nothing to do */
};

static DEFINE_SPINLOCK(gdr_procs_lock);	/* gdr_procs, every gdr_proc's refs */
static DEFINE_HASHTABLE(gdr_procs, 6);

struct gdr_file;

struct gdr_region {
	refcount_t ref;				/* its owner's + GET_PAGES' */
	spinlock_t lock;			/* state, pt, published */
	enum gdr_region_state state;
	struct nvidia_p2p_page_table *pt;
	bool published;				/* in gf's table: the callback tells gf */
	bool persistent;
	struct gdr_file *gf;
	struct gdr_owner owner;			/* the only process put_pages works in */
	struct gdr_user *user;			/* charged, once the slot is reserved */
	struct gdr_proc *proc;			/* its owner's; referenced while orphaned */
	struct list_head orphan_node;		/* proc->orphans or gdr_persist_orphans */
	struct list_head reap_node;		/* gdr_reap_list: revoked while orphaned */
	u64 handle;
	u64 va;
	u64 len;
	u32 npages;
	u8 gpu_uuid[16];
	u64 *phys;				/* npages bus addresses, read at pin */
};

static DEFINE_MUTEX(gdr_persist_lock);	/* gdr_persist_orphans */
static LIST_HEAD(gdr_persist_orphans);
static unsigned int gdr_nr_persist_orphans;	/* under gdr_persist_lock */
static DEFINE_SPINLOCK(gdr_reap_lock);	/* gdr_reap_list */
static LIST_HEAD(gdr_reap_list);
static void gdr_orphans_retry_fn(struct work_struct *work);
static void gdr_orphans_reap_fn(struct work_struct *work);
static DECLARE_DELAYED_WORK(gdr_retry_work, gdr_orphans_retry_fn);
static DECLARE_DELAYED_WORK(gdr_reap_work, gdr_orphans_reap_fn);

/* Slot markers: taken by a PIN that has not finished; generations used up. */
#define GDR_SLOT_RESERVED ((struct gdr_region *)1)
#define GDR_SLOT_RETIRED  ((struct gdr_region *)2)

struct gdr_file {
	struct gdr_owner owner;
	struct gdr_user *user;
	struct gdr_proc *proc;

	struct mutex lock;			/* dead, regions, gens, counts */
	bool dead;				/* the owner closed it or died */
	struct gdr_region **regions;		/* nslots entries */
	u32 *gens;				/* last generation per slot */
	u32 nslots;
	u32 nr_usable;				/* slots not retired */
	u32 nr_pins;
	u32 next_slot;
	u64 pinned_bytes;

	spinlock_t ev_lock;			/* area stores, ev_* */
	struct gdrcache_revoke_area *area;	/* __vmalloc, mapped read-only */
	size_t area_size;
	struct gdrcache_event *evq;
	u32 ev_cap;
	u32 ev_head;
	u32 ev_count;
	bool ev_overflowed;
	wait_queue_head_t ev_wait;

	/* The anchor: the page open() maps into the owner (see the top). */
	bool anchor_pending;			/* open() is making it */
	atomic_t anchor_vmas;			/* its VMAs (a split or copy adds one) */
	struct mm_struct *anchor_mm;		/* compared, never dereferenced */
	unsigned long anchor_addr;
};

static void gdr_owner_current(struct gdr_owner *o)
{
	o->tgid = current->tgid;
	o->start_time = current->group_leader->start_time;
	o->exec_id = current->self_exec_id;
}

/* The owner's process, whatever it has exec'ed since. */
static bool gdr_same_process(const struct gdr_file *gf)
{
	return current->tgid == gf->owner.tgid &&
	       current->group_leader->start_time == gf->owner.start_time;
}

static bool gdr_may_use(const struct gdr_file *gf)
{
	return gdr_same_process(gf) &&
	       current->self_exec_id == gf->owner.exec_id &&
	       !READ_ONCE(gf->dead);
}

/*
 * Who a pin is charged to: the opener's real uid, unless it runs in a user
 * namespace that a user other than root created; then the creator of the
 * outermost such namespace. A user with subordinate uids (newuidmap) runs
 * under as many kernel uids as it has, in a namespace it owns: charging them
 * apart would give it the caps once per uid. Namespaces that root made (a
 * container runtime's) keep their uids apart, as root assigned them.
 */
static kuid_t gdr_charge_uid(void)
{
	kuid_t uid = current_uid();
#ifdef CONFIG_USER_NS
	const struct user_namespace *ns;

	for (ns = current_user_ns(); ns->level > 0; ns = ns->parent)
		if (!uid_eq(ns->owner, GLOBAL_ROOT_UID))
			uid = ns->owner;
#endif
	return uid;
}

static struct gdr_user *gdr_user_get(kuid_t uid)
{
	struct gdr_user *u, *fresh;

	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL_ACCOUNT);
	if (!fresh)
		return NULL;
	spin_lock(&gdr_acct_lock);
	hash_for_each_possible(gdr_users, u, node, __kuid_val(uid)) {
		if (uid_eq(u->uid, uid)) {
			u->refs++;
			goto out_unlock;
		}
	}
	u = fresh;
	fresh = NULL;
	u->uid = uid;
	u->refs = 1;
	hash_add(gdr_users, &u->node, __kuid_val(uid));
out_unlock:
	spin_unlock(&gdr_acct_lock);
	kfree(fresh);
	return u;
}

/* Caller holds gdr_acct_lock; returns u if the caller must free it. */
static struct gdr_user *gdr_user_unref_locked(struct gdr_user *u)
{
	if (--u->refs)
		return NULL;
	hash_del(&u->node);
	return u;
}

static void gdr_user_put(struct gdr_user *u)
{
	spin_lock(&gdr_acct_lock);
	u = gdr_user_unref_locked(u);
	spin_unlock(&gdr_acct_lock);
	kfree(u);
}

/* The current process's gdr_proc, made on its first open. */
static struct gdr_proc *gdr_proc_get(const struct gdr_owner *o)
{
	struct gdr_proc *p, *fresh;

	fresh = kzalloc(sizeof(*fresh), GFP_KERNEL_ACCOUNT);
	if (!fresh)
		return NULL;
	spin_lock(&gdr_procs_lock);
	hash_for_each_possible(gdr_procs, p, node, o->tgid) {
		if (p->tgid == o->tgid && p->start_time == o->start_time) {
			p->refs++;
			goto out_unlock;
		}
	}
	p = fresh;
	fresh = NULL;
	p->tgid = o->tgid;
	p->start_time = o->start_time;
	p->refs = 1;
	mutex_init(&p->lock);
	INIT_LIST_HEAD(&p->orphans);
	hash_add(gdr_procs, &p->node, p->tgid);
out_unlock:
	spin_unlock(&gdr_procs_lock);
	kfree(fresh);
	return p;
}

static void gdr_proc_hold(struct gdr_proc *p)
{
	spin_lock(&gdr_procs_lock);
	p->refs++;
	spin_unlock(&gdr_procs_lock);
}

static void gdr_proc_put(struct gdr_proc *p)
{
	spin_lock(&gdr_procs_lock);
	if (--p->refs) {
		p = NULL;
	} else {
		hash_del(&p->node);
	}
	spin_unlock(&gdr_procs_lock);
	kfree(p);
}

static void gdr_orphans_count(int delta)
{
	spin_lock(&gdr_acct_lock);
	gdr_nr_orphans += delta;
	spin_unlock(&gdr_acct_lock);
}

/* Charge one pin of len bytes to u and to the totals, within the caps. */
static int gdr_charge(struct gdr_user *u, u64 len)
{
	u64 upins = READ_ONCE(max_user_pins), ubytes = READ_ONCE(max_user_pinned_bytes);
	u64 tpins = READ_ONCE(max_total_pins), tbytes = READ_ONCE(max_total_pinned_bytes);
	const char *cap = NULL;
	u64 ub, tb, limit = 0;
	int ret = 0;

	spin_lock(&gdr_acct_lock);
	if (check_add_overflow(u->bytes, len, &ub))
		ub = U64_MAX;
	if (check_add_overflow(gdr_total_bytes, len, &tb))
		tb = U64_MAX;
	if (upins && u->pins >= upins) {
		cap = "max_user_pins";
		limit = upins;
		ret = -EDQUOT;
	} else if (ubytes && ub > ubytes) {
		cap = "max_user_pinned_bytes";
		limit = ubytes;
		ret = -EDQUOT;
	} else if (tpins && gdr_total_pins >= tpins) {
		cap = "max_total_pins";
		limit = tpins;
		ret = -ENOSPC;
	} else if (tbytes && tb > tbytes) {
		cap = "max_total_pinned_bytes";
		limit = tbytes;
		ret = -ENOSPC;
	} else {
		u->refs++;
		u->pins++;
		u->bytes = ub;
		gdr_total_pins++;
		gdr_total_bytes = tb;
	}
	spin_unlock(&gdr_acct_lock);
	if (cap)
		pr_err_ratelimited("uid %u: pin of %llu bytes refused: %s=%llu reached\n",
				   __kuid_val(u->uid), len, cap, limit);
	return ret;
}

static void gdr_uncharge(struct gdr_user *u, u64 len)
{
	spin_lock(&gdr_acct_lock);
	u->pins--;
	u->bytes -= len;
	gdr_total_pins--;
	gdr_total_bytes -= len;
	u = gdr_user_unref_locked(u);
	spin_unlock(&gdr_acct_lock);
	kfree(u);
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

/*
 * Make a revocation visible: slot store, then count (release), then event.
 * Caller holds r->lock, and r is published in gf.
 */
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
 * event lock inside it), never sleeps, never calls put_pages. It tells the
 * file only about a region PIN has published; a region PIN is still making
 * is published revoked by PIN itself. nvidia_p2p_free_page_table() is called
 * after the lock is dropped: drivers that free the table there may sleep.
 */
static void gdr_free_callback(void *data)
{
	struct gdr_region *r = data;
	struct nvidia_p2p_page_table *pt;
	bool reap = false;
	unsigned long flags;

	spin_lock_irqsave(&r->lock, flags);
	/*
	 * Whoever holds r holds this module (an open file, or an orphan's
	 * reference): keep it loaded until this function is done with its
	 * code and its work items, since once the lock is dropped nothing
	 * else waits for us (an UNPIN or close that finds r revoked calls no
	 * put_pages, and may free r, close and let the module go).
	 */
	__module_get(THIS_MODULE);
	pt = r->pt;
	switch (r->state) {
	case GDR_REGION_PINNED:
		if (r->published)
			gdr_publish_revoke(r->gf, r);
		break;
	case GDR_REGION_ORPHANED:	/* on its owner's list: the reaper's now */
		reap = true;
		break;
	case GDR_REGION_PUTTING:	/* its put_pages waits for us */
	case GDR_REGION_REVOKED:
		break;
	}
	r->state = GDR_REGION_REVOKED;
	r->pt = NULL;
	spin_unlock_irqrestore(&r->lock, flags);
	/*
	 * A revoked orphan is finished by the reaper alone (its owner's retry
	 * skips it), so r lives until the reaper has run. Any other r may be
	 * freed from here on.
	 */
	if (reap) {
		spin_lock_irqsave(&gdr_reap_lock, flags);
		list_add_tail(&r->reap_node, &gdr_reap_list);
		spin_unlock_irqrestore(&gdr_reap_lock, flags);
		queue_delayed_work(system_wq, &gdr_reap_work, 0);
	}
	if (pt)
		nvidia_p2p_free_page_table(pt);
	/* Last, as a tail call: it returns to NVIDIA, not here (top of file). */
	module_put(THIS_MODULE);
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
		r->state = GDR_REGION_PUTTING;
		pt = r->pt;
	}
	spin_unlock_irqrestore(&r->lock, flags);
	return pt;
}

/*
 * Give a claimed page table back to NVIDIA. No lock held but possibly r's
 * owner's gdr_proc.lock or gdr_persist_lock. Returns true when r holds
 * nothing any more (put, or taken by a racing callback); false when the put
 * failed: r is then still PUTTING (the caller makes it an orphan) and its
 * page table still live.
 */
static bool gdr_region_put_pages(struct gdr_region *r,
				 struct nvidia_p2p_page_table *pt)
{
	unsigned long flags;
	bool done;
	int ret;

#if GDR_HAVE_PERSISTENT
	if (r->persistent)
		ret = nvidia_p2p_put_pages_persistent(r->va, pt, 0);
	else
#endif
		/*
		 * Only in r's owner's process (see the top of this file).
		 * Blocks while a callback on pt runs; after it, none can start.
		 * 0 also when that callback took the table.
		 */
		ret = nvidia_p2p_put_pages(0, 0, r->va, pt);
	if (!ret)
		return true;
	spin_lock_irqsave(&r->lock, flags);
	/* A callback that raced with us took the page table: nothing to put. */
	done = r->state == GDR_REGION_REVOKED;
	spin_unlock_irqrestore(&r->lock, flags);
	if (!done)
		pr_err_ratelimited("%sput_pages va 0x%llx len 0x%llx: %d; kept until %s\n",
				   r->persistent ? "persistent " : "", r->va, r->len, ret,
				   r->persistent ? "a retry succeeds" :
				   "the free callback or the owner's next call");
	return done;
}

static void gdr_region_put(struct gdr_region *r)
{
	if (refcount_dec_and_test(&r->ref)) {
		kvfree(r->phys);
		kfree(r);
	}
}

/* r holds no page table any more: drop its charge and its owner's reference. */
static void gdr_region_done(struct gdr_region *r)
{
	if (r->user)
		gdr_uncharge(r->user, r->len);
	gdr_region_put(r);
}

/* An orphan is finished: no list holds it, nothing is left to put. */
static void gdr_orphan_done(struct gdr_region *r)
{
	struct gdr_proc *proc = r->persistent ? NULL : r->proc;

	gdr_region_done(r);
	if (proc)
		gdr_proc_put(proc);
	gdr_orphans_count(-1);
	/* The caller is a file operation or a worker that gdr_exit() waits for. */
	module_put(THIS_MODULE);
}

/*
 * r is claimed (PUTTING) and its put failed or may not be made here: keep it
 * as an orphan, on its owner's list (callback mode) or the worker's
 * (persistent). The state becomes ORPHANED under the list's lock, after
 * which a callback hands r to the reaper, which takes that lock too.
 */
static void gdr_region_orphan(struct gdr_region *r)
{
	struct mutex *lock = r->persistent ? &gdr_persist_lock : &r->proc->lock;
	unsigned long flags;
	bool revoked;

	mutex_lock(lock);
	spin_lock_irqsave(&r->lock, flags);
	revoked = r->state == GDR_REGION_REVOKED;
	if (!revoked)
		r->state = GDR_REGION_ORPHANED;
	spin_unlock_irqrestore(&r->lock, flags);
	if (!revoked) {
		if (r->persistent) {
			list_add_tail(&r->orphan_node, &gdr_persist_orphans);
			gdr_nr_persist_orphans++;
		} else {
			gdr_proc_hold(r->proc);
			list_add_tail(&r->orphan_node, &r->proc->orphans);
			WRITE_ONCE(r->proc->nr_orphans, r->proc->nr_orphans + 1);
		}
		gdr_orphans_count(1);
		/* No unload while NVIDIA may still call gdr_free_callback(r). */
		__module_get(THIS_MODULE);
	}
	mutex_unlock(lock);
	if (revoked)
		gdr_region_done(r);
	else if (r->persistent)
		queue_delayed_work(system_wq, &gdr_retry_work, GDR_RETRY_DELAY);
}

/* May the current process put r's page table? */
static bool gdr_may_put(const struct gdr_region *r, const struct gdr_owner *who)
{
	if (r->persistent)
		return true;
	return who && who->tgid == r->owner.tgid &&
	       who->start_time == r->owner.start_time;
}

/*
 * r is in no file's table: give back its page table pt (or orphan r).
 * A callback-mode table can only be put in its owner's process: from any other
 * (gdr_release() in a process sharing the owner's descriptor table through
 * clone(CLONE_FILES), a kworker's delayed fput) NVIDIA's put_pages returns 0
 * and releases nothing, and r would be freed with the callback still armed on
 * it. Such a region becomes an orphan: the callback, or the owner's next call,
 * finishes it.
 */
static void gdr_region_give_back(struct gdr_region *r,
				 struct nvidia_p2p_page_table *pt)
{
	struct gdr_owner me;

	if (pt && !r->persistent) {
		gdr_owner_current(&me);
		if (!gdr_may_put(r, &me)) {
			gdr_region_orphan(r);
			return;
		}
	}
	if (pt && !gdr_region_put_pages(r, pt)) {
		gdr_region_orphan(r);
		return;
	}
	gdr_region_done(r);
}

/*
 * Put again up to max orphans of the list under lock (held by the caller),
 * skipping those a callback revoked (the reaper finishes them). Finished ones
 * are moved to done. Returns how many remain.
 */
static unsigned int gdr_orphans_put_list(struct list_head *orphans,
					 unsigned int *nr, unsigned int max,
					 struct list_head *done)
{
	struct nvidia_p2p_page_table *pt;
	struct gdr_region *r, *tmp;
	unsigned int tried = 0;
	unsigned long flags;
	bool finished;

	list_for_each_entry_safe(r, tmp, orphans, orphan_node) {
		if (tried++ >= max)
			break;
		pt = NULL;
		spin_lock_irqsave(&r->lock, flags);
		if (r->state == GDR_REGION_ORPHANED) {
			r->state = GDR_REGION_PUTTING;
			pt = r->pt;
		}
		spin_unlock_irqrestore(&r->lock, flags);
		if (!pt)
			continue;
		finished = gdr_region_put_pages(r, pt);
		if (!finished) {
			/* A callback may have come while r was PUTTING. */
			spin_lock_irqsave(&r->lock, flags);
			finished = r->state == GDR_REGION_REVOKED;
			if (!finished)
				r->state = GDR_REGION_ORPHANED;
			spin_unlock_irqrestore(&r->lock, flags);
		}
		if (finished) {
			list_move_tail(&r->orphan_node, done);
			WRITE_ONCE(*nr, *nr - 1);
		}
		cond_resched();
	}
	return READ_ONCE(*nr);
}

static void gdr_orphans_finish(struct list_head *done)
{
	struct gdr_region *r, *tmp;

	list_for_each_entry_safe(r, tmp, done, orphan_node) {
		list_del(&r->orphan_node);
		gdr_orphan_done(r);
	}
}

/* Persistent orphans, from any context: the retry worker. */
static void gdr_orphans_retry_fn(struct work_struct *work)
{
	unsigned int left;
	LIST_HEAD(done);

	mutex_lock(&gdr_persist_lock);
	left = gdr_orphans_put_list(&gdr_persist_orphans, &gdr_nr_persist_orphans,
				    UINT_MAX, &done);
	mutex_unlock(&gdr_persist_lock);
	gdr_orphans_finish(&done);
	/* gdr_exit() cancels this work synchronously: safe to return. */
	if (left)
		queue_delayed_work(system_wq, &gdr_retry_work, GDR_RETRY_DELAY);
}

/* Callback-mode orphans that their free callback revoked. */
static void gdr_orphans_reap_fn(struct work_struct *work)
{
	struct gdr_region *r, *tmp;
	unsigned long flags;
	LIST_HEAD(reap);

	spin_lock_irqsave(&gdr_reap_lock, flags);
	list_splice_init(&gdr_reap_list, &reap);
	spin_unlock_irqrestore(&gdr_reap_lock, flags);
	list_for_each_entry_safe(r, tmp, &reap, reap_node) {
		list_del(&r->reap_node);
		mutex_lock(&r->proc->lock);
		list_del(&r->orphan_node);
		WRITE_ONCE(r->proc->nr_orphans, r->proc->nr_orphans - 1);
		mutex_unlock(&r->proc->lock);
		gdr_orphan_done(r);
	}
}

/*
 * The current process owns proc: put back up to max of its callback-mode
 * orphans. Other owners' orphans are neither looked at nor waited for.
 */
static void gdr_orphans_retry_owner(struct gdr_proc *proc, unsigned int max)
{
	LIST_HEAD(done);

	if (!READ_ONCE(proc->nr_orphans))
		return;
	mutex_lock(&proc->lock);
	gdr_orphans_put_list(&proc->orphans, &proc->nr_orphans, max, &done);
	mutex_unlock(&proc->lock);
	gdr_orphans_finish(&done);
}

static bool gdr_slot_live(const struct gdr_region *r)
{
	return r && r != GDR_SLOT_RESERVED && r != GDR_SLOT_RETIRED;
}

/* Caller holds gf->lock. Returns the published region of handle, or NULL. */
static struct gdr_region *gdr_lookup(struct gdr_file *gf, u64 handle)
{
	u32 slot = GDRCACHE_HANDLE_SLOT(handle);
	struct gdr_region *r;

	if (slot >= gf->nslots)
		return NULL;
	r = gf->regions[slot];
	if (!gdr_slot_live(r) || r->handle != handle)
		return NULL;
	return r;
}

/* Take a slot and a handle for r, within the file's, user's and global caps. */
static int gdr_slot_reserve(struct gdr_file *gf, struct gdr_region *r)
{
	u64 limit = READ_ONCE(max_pinned_bytes);
	u32 i, slot = 0;
	int ret;

	mutex_lock(&gf->lock);
	ret = -EACCES;
	if (gf->dead)
		goto out_unlock;
	ret = -ENOSPC;
	if (gf->nr_pins >= gf->nr_usable)
		goto out_unlock;
	if (limit && (gf->pinned_bytes + r->len < gf->pinned_bytes ||
		      gf->pinned_bytes + r->len > limit))
		goto out_unlock;
	for (i = 0; i < gf->nslots; i++) {
		slot = (gf->next_slot + i) % gf->nslots;
		if (!gf->regions[slot])
			break;
	}
	if (i == gf->nslots)
		goto out_unlock;
	ret = gdr_charge(gf->user, r->len);
	if (ret)
		goto out_unlock;
	r->user = gf->user;
	gf->next_slot = (slot + 1) % gf->nslots;
	/* Generations run 1..U32_MAX; a slot that used them all is retired. */
	gf->gens[slot]++;
	r->handle = ((u64)gf->gens[slot] << 32) | slot;
	gf->regions[slot] = GDR_SLOT_RESERVED;
	gf->nr_pins++;
	gf->pinned_bytes += r->len;
out_unlock:
	mutex_unlock(&gf->lock);
	return ret;
}

/* Caller holds gf->lock. Undo gdr_slot_reserve(), or unlink a region. */
static void gdr_slot_release(struct gdr_file *gf, struct gdr_region *r)
{
	u32 slot = GDRCACHE_HANDLE_SLOT(r->handle);

	if (gf->gens[slot] == U32_MAX) {
		gf->regions[slot] = GDR_SLOT_RETIRED;
		gf->nr_usable--;
	} else {
		gf->regions[slot] = NULL;
	}
	gf->nr_pins--;
	gf->pinned_bytes -= r->len;
}

/*
 * Page tables whose fields we read are where we read them: 1.2 or a later
 * minor (1.2 is the first with gpu_uuid; drivers up to 575 emit it), or
 * major 2 (2.0 since 580.65.06: nv-p2p.h appended a flags field, nothing
 * else moved). Not NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(): it takes one
 * major only, so a module built against either header refused the other
 * drivers' tables. An unknown major may move them: refused.
 */
static bool gdr_page_table_ok(const struct nvidia_p2p_page_table *pt)
{
	u32 major = NVIDIA_P2P_MAJOR_VERSION(pt->version);
	u32 minor = NVIDIA_P2P_MINOR_VERSION(pt->version);

	return (major == 1 && minor >= 2) || major == 2;
}

/*
 * Check a freshly pinned page table, then copy what we need out of it, a chunk
 * at a time under the region lock (so that a callback cannot hand it back
 * meanwhile). The page array is sized from the table. A callback that came
 * first leaves r revoked: PIN still succeeds and publishes the revocation.
 * Returns 0, -EIO (a page table we do not understand) or -ENOMEM.
 */
static int gdr_region_read_page_table(struct gdr_region *r)
{
	struct nvidia_p2p_page_table *pt;
	unsigned long flags;
	u64 *phys = NULL;
	u32 i = 0, end;
	int ret = 0;

	spin_lock_irqsave(&r->lock, flags);
	if (r->state != GDR_REGION_PINNED)
		goto out_unlock;
	pt = r->pt;
	if (!gdr_page_table_ok(pt)) {
		pr_err_ratelimited("page table version 0x%08x not supported\n",
				   pt->version);
		ret = -EIO;
	} else if (pt->page_size != NVIDIA_P2P_PAGE_SIZE_64KB ||
		   pt->entries != r->npages) {
		pr_err_ratelimited("page table: page size %u, %u entries for %u pages\n",
				   pt->page_size, pt->entries, r->npages);
		ret = -EIO;
	}
	spin_unlock_irqrestore(&r->lock, flags);
	if (ret)
		return ret;

	phys = kvmalloc_array(r->npages, sizeof(*phys),
			      GFP_KERNEL_ACCOUNT | __GFP_NOWARN);
	if (!phys)
		return -ENOMEM;
	while (i < r->npages) {
		spin_lock_irqsave(&r->lock, flags);
		if (r->state != GDR_REGION_PINNED)
			goto out_unlock;
		pt = r->pt;
		end = min(r->npages, i + GDR_COPY_CHUNK);
		for (; i < end; i++)
			phys[i] = pt->pages[i]->physical_address;
		if (i == r->npages) {
			if (pt->gpu_uuid)
				memcpy(r->gpu_uuid, pt->gpu_uuid,
				       sizeof(r->gpu_uuid));
			r->phys = phys;
			phys = NULL;
		}
		spin_unlock_irqrestore(&r->lock, flags);
		cond_resched();
	}
	return 0;

out_unlock:
	spin_unlock_irqrestore(&r->lock, flags);
	kvfree(phys);
	return 0;
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

/*
 * Put a finished region into the file's table. A revocation that came while
 * PIN was running is published now, after the handle exists. r is not
 * touched once gf->lock is dropped: another thread may unpin it at once.
 */
static int gdr_region_publish(struct gdr_file *gf, struct gdr_region *r)
{
	unsigned long flags;

	mutex_lock(&gf->lock);
	if (gf->dead) {
		mutex_unlock(&gf->lock);
		return -EACCES;
	}
	gf->regions[GDRCACHE_HANDLE_SLOT(r->handle)] = r;
	spin_lock_irqsave(&r->lock, flags);
	r->published = true;
	if (r->state == GDR_REGION_REVOKED)
		gdr_publish_revoke(gf, r);
	spin_unlock_irqrestore(&r->lock, flags);
	mutex_unlock(&gf->lock);
	return 0;
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

	gdr_region_give_back(r, pt);
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
	struct nvidia_p2p_page_table *pt;
	struct gdrcache_pin p;
	struct gdr_region *r;
	int ret;

	if (copy_from_user(&p, uarg, sizeof(p)))
		return -EFAULT;
	if ((p.flags & ~GDRCACHE_PIN_FLAGS_ALL) || p.reserved0 ||
	    memchr_inv(p.reserved, 0, sizeof(p.reserved)))
		return -EINVAL;
	/* Bounded before anything is allocated. */
	if (!p.len || !IS_ALIGNED(p.va, GDRCACHE_PAGE_SIZE) ||
	    !IS_ALIGNED(p.len, GDRCACHE_PAGE_SIZE) || p.va + p.len < p.va ||
	    p.len > GDR_MAX_PIN_LEN)
		return -EINVAL;
	if ((p.flags & GDRCACHE_PIN_PERSISTENT) && !GDR_HAVE_PERSISTENT)
		return -EOPNOTSUPP;

	r = kzalloc(sizeof(*r), GFP_KERNEL_ACCOUNT);
	if (!r)
		return -ENOMEM;
	refcount_set(&r->ref, 1);
	spin_lock_init(&r->lock);
	INIT_LIST_HEAD(&r->orphan_node);
	INIT_LIST_HEAD(&r->reap_node);
	r->state = GDR_REGION_PINNED;
	r->gf = gf;
	r->proc = gf->proc;
	r->owner = gf->owner;
	r->va = p.va;
	r->len = p.len;
	r->npages = p.len >> GDRCACHE_PAGE_SHIFT;
	r->persistent = p.flags & GDRCACHE_PIN_PERSISTENT;

	ret = gdr_slot_reserve(gf, r);
	if (ret)
		goto free_region;

	ret = gdr_get_pages(r);
	if (ret)
		goto release_slot;

	ret = gdr_region_read_page_table(r);
	if (ret)
		goto put_pages;

	/* Everything PIN returns is read before r is published. */
	p.page_size = GDRCACHE_PAGE_SIZE;
	p.handle = r->handle;
	p.page_count = r->npages;
	memcpy(p.gpu_uuid, r->gpu_uuid, sizeof(p.gpu_uuid));
	if (copy_to_user(uarg, &p, sizeof(p))) {
		ret = -EFAULT;
		goto put_pages;
	}
	ret = gdr_region_publish(gf, r);
	if (ret)
		goto put_pages;
	return 0;

put_pages:
	pt = gdr_region_claim(r);
	mutex_lock(&gf->lock);
	gdr_slot_release(gf, r);
	mutex_unlock(&gf->lock);
	gdr_region_give_back(r, pt);
	return ret;

release_slot:
	mutex_lock(&gf->lock);
	gdr_slot_release(gf, r);
	mutex_unlock(&gf->lock);
	gdr_region_done(r);
	return ret;

free_region:
	gdr_region_put(r);
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

/* The page array is copied out without gf->lock: a reference keeps it. */
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
		mutex_unlock(&gf->lock);
		return -ENOENT;
	}
	spin_lock_irqsave(&r->lock, flags);
	if (r->state == GDR_REGION_REVOKED)
		ret = -EIO;
	spin_unlock_irqrestore(&r->lock, flags);
	if (!ret)
		refcount_inc(&r->ref);
	mutex_unlock(&gf->lock);
	if (ret)
		return ret;

	n = min(g.max_pages, r->npages);
	if (n && copy_to_user(u64_to_user_ptr(g.pages_ptr), r->phys,
			      (size_t)n * sizeof(*r->phys)))
		ret = -EFAULT;
	g.page_count = r->npages;
	g.page_size = GDRCACHE_PAGE_SIZE;
	gdr_region_put(r);
	if (!ret && copy_to_user(uarg, &g, sizeof(g)))
		ret = -EFAULT;
	return ret;
}

static long gdr_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct gdr_file *gf = filp->private_data;
	void __user *uarg = (void __user *)arg;

	if (!gdr_may_use(gf))
		return -EACCES;
	/* Orphans' put_pages can only work here, in their owner's process. */
	gdr_orphans_retry_owner(gf->proc, GDR_ORPHAN_BATCH);

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

	if (!gdr_may_use(gf))
		return -EACCES;
	if (count < sizeof(batch[0]))
		return -EINVAL;

	spin_lock_irq(&gf->ev_lock);
	while (!gf->ev_count) {
		spin_unlock_irq(&gf->ev_lock);
		if (filp->f_flags & O_NONBLOCK)
			return -EAGAIN;
		ret = wait_event_interruptible(gf->ev_wait,
					       READ_ONCE(gf->ev_count) ||
					       READ_ONCE(gf->dead));
		if (ret)
			return ret;
		if (READ_ONCE(gf->dead))
			return -EACCES;
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

	if (!gdr_may_use(gf))
		return EPOLLERR;
	poll_wait(filp, &gf->ev_wait, wait);
	if (READ_ONCE(gf->dead))
		return EPOLLERR;
	return READ_ONCE(gf->ev_count) ? EPOLLIN | EPOLLRDNORM : 0;
}

static void gdr_vma_set_flags(struct vm_area_struct *vma, vm_flags_t set,
			      vm_flags_t clear)
{
#ifdef GDR_HAVE_VM_FLAGS_CLEAR
	vm_flags_mod(vma, set, clear);
#else
	vma->vm_flags = (vma->vm_flags | set) & ~clear;
#endif
}

static void gdr_file_end(struct gdr_file *gf);

static void gdr_anchor_open(struct vm_area_struct *vma)
{
	struct gdr_file *gf = vma->vm_private_data;

	atomic_inc(&gf->anchor_vmas);
}

/*
 * The anchor goes. With its address space (no user left: the owner's exit or
 * execve, in the owner's context unless another task held the last reference
 * to that mm), the owner is going: end the file, whoever else shares its
 * descriptors. By munmap(), the owner gave the anchor up: only its close()
 * ends the file then.
 */
static void gdr_anchor_close(struct vm_area_struct *vma)
{
	struct gdr_file *gf = vma->vm_private_data;
	bool teardown = !atomic_read(&vma->vm_mm->mm_users);

	if (atomic_dec_and_test(&gf->anchor_vmas))
		WRITE_ONCE(gf->anchor_mm, NULL);
	if (!teardown || READ_ONCE(gf->dead))
		return;
	gdr_file_end(gf);
	if (gdr_same_process(gf))
		gdr_orphans_retry_owner(gf->proc, UINT_MAX);
}

static const struct vm_operations_struct gdr_anchor_ops = {
	.open	= gdr_anchor_open,
	.close	= gdr_anchor_close,
};

/*
 * The owner closed the file in its own address space: unmap the anchor, or the
 * file would stay open through it until the owner exits. Only what is still
 * the anchor is unmapped (a thread that unmaps it and maps something else at
 * that address between the check and vm_munmap() loses its own mapping).
 */
static void gdr_anchor_remove(struct gdr_file *gf)
{
	unsigned long addr = READ_ONCE(gf->anchor_addr);
	struct mm_struct *mm = current->mm;
	struct vm_area_struct *vma;
	bool ours;

	if (!mm || READ_ONCE(gf->anchor_mm) != mm)
		return;
	mmap_read_lock(mm);
	vma = find_vma(mm, addr);
	ours = vma && vma->vm_start == addr && vma->vm_ops == &gdr_anchor_ops &&
	       vma->vm_private_data == gf;
	mmap_read_unlock(mm);
	if (ours)
		vm_munmap(addr, PAGE_SIZE);
}

/* open() maps the anchor: the first page of the area, read-only. */
static int gdr_mmap_anchor(struct gdr_file *gf, struct vm_area_struct *vma)
{
	int ret;

	gdr_vma_set_flags(vma, VM_IO | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP,
			  VM_MAYWRITE);
	ret = vm_insert_page(vma, vma->vm_start, vmalloc_to_page(gf->area));
	if (ret)
		return ret;
	vma->vm_private_data = gf;
	vma->vm_ops = &gdr_anchor_ops;
	atomic_inc(&gf->anchor_vmas);
	gf->anchor_mm = vma->vm_mm;
	return 0;
}

/*
 * The revocation area, read-only. Not inherited by fork() (VM_DONTCOPY): a
 * child has no business reading its parent's revocations. VM_IO keeps it so:
 * madvise(MADV_DOFORK) clears VM_DONTCOPY on any other mapping (and VM_IO
 * also keeps get_user_pages(), hence /proc/PID/mem and ptrace, off it).
 */
static int gdr_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct gdr_file *gf = filp->private_data;
	unsigned long off, size = vma->vm_end - vma->vm_start;
	int ret;

	if (!gdr_may_use(gf))
		return -EACCES;
	if (vma->vm_pgoff || size > gf->area_size)
		return -EINVAL;
	if (vma->vm_flags & VM_WRITE)
		return -EPERM;
	if (gf->anchor_pending)
		return gdr_mmap_anchor(gf, vma);
	gdr_vma_set_flags(vma, VM_IO | VM_DONTCOPY | VM_DONTEXPAND | VM_DONTDUMP,
			  VM_MAYWRITE);
	for (off = 0; off < size; off += PAGE_SIZE) {
		ret = vm_insert_page(vma, vma->vm_start + off,
				     vmalloc_to_page((u8 *)gf->area + off));
		if (ret)
			return ret;
	}
	return 0;
}

static int gdr_open(struct inode *inode, struct file *filp)
{
	u32 nslots = clamp(max_pins, 1U, GDR_MAX_PINS_LIMIT);
	u32 ev_cap = clamp(event_queue_len, 2U, GDR_MAX_EVENTS_LIMIT);
	struct gdr_file *gf;
	int ret = -ENOMEM;

	/* Everything per file is charged to the opener's memory cgroup. */
	gf = kzalloc(sizeof(*gf), GFP_KERNEL_ACCOUNT);
	if (!gf)
		return -ENOMEM;
	gdr_owner_current(&gf->owner);
	mutex_init(&gf->lock);
	spin_lock_init(&gf->ev_lock);
	init_waitqueue_head(&gf->ev_wait);
	gf->nslots = nslots;
	gf->nr_usable = nslots;
	gf->ev_cap = ev_cap;

	gf->proc = gdr_proc_get(&gf->owner);
	if (!gf->proc)
		goto free_file;
	gf->user = gdr_user_get(gdr_charge_uid());
	if (!gf->user)
		goto put_proc;
	gf->regions = kvcalloc(nslots, sizeof(*gf->regions), GFP_KERNEL_ACCOUNT);
	if (!gf->regions)
		goto put_user;
	gf->gens = kvcalloc(nslots, sizeof(*gf->gens), GFP_KERNEL_ACCOUNT);
	if (!gf->gens)
		goto free_regions;
	gf->evq = kvcalloc(ev_cap, sizeof(*gf->evq), GFP_KERNEL_ACCOUNT);
	if (!gf->evq)
		goto free_gens;
	gf->area_size = PAGE_ALIGN(struct_size(gf->area, slot, nslots));
	gf->area = __vmalloc(gf->area_size, GFP_KERNEL_ACCOUNT | __GFP_ZERO);
	if (!gf->area)
		goto free_evq;
	gf->area->nslots = nslots;

	filp->private_data = gf;
	nonseekable_open(inode, filp);
	/* Last: the anchor's VMA holds the file, so nothing may fail after it. */
	if (current->mm && !(current->flags & PF_KTHREAD)) {
		unsigned long addr;

		gf->anchor_pending = true;
		addr = vm_mmap(filp, 0, PAGE_SIZE, PROT_READ, MAP_SHARED, 0);
		gf->anchor_pending = false;
		if (IS_ERR_VALUE(addr)) {
			ret = (int)addr;
			goto free_area;
		}
		gf->anchor_addr = addr;
	}
	return 0;

free_area:
	vfree(gf->area);
free_evq:
	kvfree(gf->evq);
free_gens:
	kvfree(gf->gens);
free_regions:
	kvfree(gf->regions);
put_user:
	gdr_user_put(gf->user);
put_proc:
	gdr_proc_put(gf->proc);
free_file:
	kfree(gf);
	return ret;
}

/* The owner closed the file or died: give back every pin, refuse all calls. */
static void gdr_file_end(struct gdr_file *gf)
{
	struct nvidia_p2p_page_table *pt;
	struct gdr_region *r;
	u32 slot;

	mutex_lock(&gf->lock);
	WRITE_ONCE(gf->dead, true);
	mutex_unlock(&gf->lock);
	wake_up_interruptible(&gf->ev_wait);

	for (slot = 0; slot < gf->nslots; slot++) {
		pt = NULL;
		mutex_lock(&gf->lock);
		r = gf->regions[slot];
		if (gdr_slot_live(r)) {
			pt = gdr_region_claim(r);
			gdr_slot_release(gf, r);
		} else {
			r = NULL;
		}
		mutex_unlock(&gf->lock);
		if (r)
			gdr_region_give_back(r, pt);
	}
}

/*
 * Every close() of a descriptor. The owner's ends the file, whoever else still
 * holds it, and unmaps the anchor (the owner's exit ends it earlier, through
 * the anchor). A PIN in flight in another thread sees the file dead when it
 * publishes and gives its pin back.
 */
static int gdr_flush(struct file *filp, fl_owner_t id)
{
	struct gdr_file *gf = filp->private_data;

	if (!READ_ONCE(gf->dead) && gdr_same_process(gf)) {
		gdr_file_end(gf);
		gdr_orphans_retry_owner(gf->proc, UINT_MAX);
		gdr_anchor_remove(gf);
	}
	return 0;
}

/* Last reference (the last descriptor, mapping or in-flight SCM_RIGHTS). */
static int gdr_release(struct inode *inode, struct file *filp)
{
	struct gdr_file *gf = filp->private_data;

	gdr_file_end(gf);
	vfree(gf->area);
	kvfree(gf->evq);
	kvfree(gf->gens);
	kvfree(gf->regions);
	gdr_user_put(gf->user);
	/* After gdr_file_end(): the orphans it made hold their own references. */
	gdr_proc_put(gf->proc);
	kfree(gf);
	return 0;
}

static const struct file_operations gdr_fops = {
	.owner		= THIS_MODULE,
	.open		= gdr_open,
	.flush		= gdr_flush,
	.release	= gdr_release,
	.unlocked_ioctl	= gdr_ioctl,
	.compat_ioctl	= compat_ptr_ioctl,
	.read		= gdr_read,
	.poll		= gdr_poll,
	.mmap		= gdr_mmap,
};

/* 0660: the group comes from the udev rule (60-gdrcache.rules). */
static struct miscdevice gdr_misc = {
	.minor	= MISC_DYNAMIC_MINOR,
	.name	= GDRCACHE_DEVICE_NAME,
	.fops	= &gdr_fops,
	.mode	= 0660,
};

static int __init gdr_init(void)
{
	int ret;

	ret = misc_register(&gdr_misc);
	if (ret) {
		pr_err("misc_register: %d\n", ret);
		return ret;
	}
	pr_info("version %s, uapi %u.%u, max_pins %u\n", GDR_VERSION,
		GDRCACHE_UAPI_VERSION_MAJOR, GDRCACHE_UAPI_VERSION_MINOR, max_pins);
	return 0;
}

/* No file is open and no orphan is left: each holds a module reference. */
static void __exit gdr_exit(void)
{
	misc_deregister(&gdr_misc);
	cancel_delayed_work_sync(&gdr_retry_work);
	cancel_delayed_work_sync(&gdr_reap_work);
}

module_init(gdr_init);
module_exit(gdr_exit);

MODULE_DESCRIPTION("GPUDirect RDMA registration cache: pins GPU memory through nvidia_p2p_get_pages");
MODULE_LICENSE("Dual MIT/GPL");
/* The project's VERSION file, passed in by Kbuild. */
MODULE_VERSION(GDR_VERSION);
/* modprobe loads NVIDIA's driver first, whose nvidia_p2p_* we import. */
MODULE_SOFTDEP("pre: nvidia");
