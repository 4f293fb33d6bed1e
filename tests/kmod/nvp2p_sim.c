// SPDX-License-Identifier: GPL-2.0
/*
 * nvp2p_sim.ko: a simulated NVIDIA P2P provider, for tests only.
 *
 * SIMULATION. No machine here can load NVIDIA's driver beside gdrcache.ko, so
 * this module exports nvidia_p2p_get_pages(), nvidia_p2p_put_pages(),
 * nvidia_p2p_get_pages_persistent(), nvidia_p2p_put_pages_persistent(),
 * nvidia_p2p_free_page_table(), nvidia_p2p_dma_map_pages(),
 * nvidia_p2p_dma_unmap_pages() and nvidia_p2p_free_dma_mapping() with
 * NVIDIA's prototypes (kmod/nv_p2p_abi.h), over ordinary memory:
 *
 *  - "GPU memory" is anonymous user memory that a process declares with the
 *    ALLOC ioctl of /dev/nvp2p_sim (tests/kmod/nvp2p_sim_uapi.h); ALLOC pins
 *    its pages (pin_user_pages_fast, FOLL_LONGTERM | FOLL_WRITE) so that
 *    soft-RoCE can register the same VA.
 *  - get_pages serves 64 KiB-aligned ranges inside one live allocation of the
 *    calling process (p2p_token and va_space 0 = the caller's VA space) as a
 *    page table of version page_table_version (default 1.2, what NVIDIA's
 *    drivers emit: NVIDIA_P2P_PAGE_TABLE_VERSION), 64 KiB pages:
 *    one entry per 64 KiB whose physical address is that of its first CPU
 *    page. Real GPU pages are physically contiguous 64 KiB BAR pages; these
 *    are not, so nothing may DMA through them beyond the first CPU page.
 *  - FREE (and closing the control file, the owning process exiting) fires,
 *    synchronously, the free callbacks of every callback-mode pin on the
 *    allocation, as NVIDIA's driver does inside cuMemFree. Each callback must
 *    call nvidia_p2p_free_page_table() (else WARNING); afterwards the page
 *    table's entries are freed and its fields poisoned, so a client that
 *    still reads it faults.
 *  - nvidia_p2p_free_page_table() must be called from the callback, and in a
 *    context that may sleep: older drivers freed the table there. A call with
 *    interrupts off or preemption disabled is counted (free_table_atomic) and
 *    logged, not warned about, so that a test can tell.
 *  - put_pages blocks while a callback on that page table is being
 *    dispatched (NVIDIA's teardown and rm_p2p_put_pages() both run under the
 *    RM API lock), then returns 0, as nv_p2p_put_pages() does when the RM
 *    no longer finds the table (NV_ERR_OBJECT_NOT_FOUND is turned into 0).
 *    Revoked page tables are kept as tombstones (up to SIM_MAX_TOMBSTONES)
 *    so that such a late put never hits a reused pointer.
 *  - put_pages from a process other than the one that pinned returns 0 and
 *    releases nothing: RmP2PPutPages() with p2p_token 0 looks the table up
 *    among the RM clients of osGetCurrentProcess() (current->tgid), finds
 *    nothing, and nv_p2p_put_pages() reports that as success. The pin stays
 *    live and its callback still comes (counted in put_foreign).
 *  - Persistent pins get no callback; they keep the allocation's pages pinned
 *    after FREE until the last put_pages_persistent, which works from any
 *    context (RmP2PPutPagesPersistent() takes the RM object, not a pid).
 *  - 535's persistent calls refuse any flag but 0 with -EINVAL.
 *  - A failed get_pages leaves *page_table pointing at freed memory, as
 *    nv_p2p_get_pages() does (it stores &mem_info->page_table first and
 *    frees mem_info on failure): here a poison pointer that faults if read.
 *  - Return codes are those nvidia_p2p_map_status() produces: -EINVAL,
 *    -ENOMEM, -EIO, -ENOTSUPP, -EBUSY (NV_ERR_STATE_IN_USE), -ENODEV
 *    (NV_ERR_GPU_UUID_NOT_FOUND, the persistent path); any of them can be
 *    injected (NVP2P_SIM_FAULT_GET_ERR).
 *  - nvidia_p2p_free_page_table() and nvidia_p2p_free_dma_mapping() return
 *    0 whatever they are given (no-ops in the open driver); the misuse checks
 *    above only log and warn.
 *  - dma_map_pages returns the physical addresses unchanged (no IOMMU).
 *  - Faults: -ENOMEM once N pins are outstanding (BAR exhaustion), -EIO on
 *    the next N get_pages, one chosen error from the next get_pages, a delay
 *    around each callback dispatch to widen races, -ENOMEM from the next N
 *    put_pages (nv_kmem_cache_alloc_stack() failing: nothing is released,
 *    the callback stays armed), a delay between arming the callback and
 *    returning from get_pages (SET_FAULT); -ENOTSUPP from get_pages via the
 *    enotsupp parameter; the page table version via page_table_version.
 *
 * Not determined from NVIDIA's source, kept strict here (the module never
 * does these): put_pages on a persistent table, put_pages_persistent on a
 * table that is not one (NVIDIA dereferences it), put_pages from inside a
 * free callback (NVIDIA would re-take the RM API lock its teardown holds).
 *
 * Not simulated: BAR1 address space, real GPU page sizes and contiguity,
 * p2p tokens, MIG, vGPU, the rsync API, nvidia_p2p_init_mapping.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/delay.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/sched.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/uaccess.h>
#include <linux/wait.h>

#include "nv_p2p_abi.h"
#include "nvp2p_sim_uapi.h"

#define SIM_GPU_PAGE_SIZE	(64UL * 1024)
#define SIM_MAX_ALLOC		(1ULL << 30)
#define SIM_MAX_TOMBSTONES	4096
#define SIM_MAX_CB_DELAY_US	1000000
/* Longest wait of a put_pages at the closed gate (FAULT_PUT_GATE): tests never hang. */
#define SIM_PUT_GATE_MAX	(30 * HZ)
/* What a failed get_pages leaves in *page_table: NVIDIA leaves freed memory. */
#define SIM_POISON_PT		((struct nvidia_p2p_page_table *)0xdead0000000ba5e0UL)

static uint page_table_version = NVIDIA_P2P_PAGE_TABLE_VERSION;
module_param(page_table_version, uint, 0644);
MODULE_PARM_DESC(page_table_version,
		 "Version stored in the page tables handed out (default 0x00010002 = 1.2)");

static uint enotsupp;
module_param(enotsupp, uint, 0644);
MODULE_PARM_DESC(enotsupp,
		 "get_pages fails with -ENOTSUPP: 0 never, 1 persistent only, 2 always");

/* Race counters, read by kmod_race_stress to show which windows it hit. */
static ulong race_put_waited;
module_param(race_put_waited, ulong, 0444);
MODULE_PARM_DESC(race_put_waited,
		 "put_pages calls that waited for a callback in flight on their page table");
static ulong race_put_late;
module_param(race_put_late, ulong, 0444);
MODULE_PARM_DESC(race_put_late,
		 "put_pages calls on a page table whose callback had already run");
static ulong put_foreign;
module_param(put_foreign, ulong, 0444);
MODULE_PARM_DESC(put_foreign,
		 "put_pages calls from a process other than the pinning one (returned 0, released nothing)");
static ulong free_table_atomic;
module_param(free_table_atomic, ulong, 0444);
MODULE_PARM_DESC(free_table_atomic,
		 "nvidia_p2p_free_page_table calls made with interrupts or preemption disabled");

struct sim_ctl {
	struct list_head allocs;	/* sim_alloc.ctl_node, under sim_lock */
};

struct sim_alloc {
	struct kref ref;		/* the live lists hold one, each pin one */
	struct list_head node;		/* sim_allocs, while live */
	struct list_head ctl_node;	/* sim_ctl.allocs, while live */
	struct sim_ctl *ctl;
	struct mm_struct *mm;		/* mmgrab'ed: get_pages matches on it */
	u64 id;
	u64 va;
	u64 len;
	unsigned long npages;		/* CPU pages */
	struct page **pages;
};

enum sim_pin_state {
	SIM_PIN_LIVE,
	SIM_PIN_REVOKING,		/* its free callback is being dispatched */
	SIM_PIN_REVOKED,		/* a tombstone */
};

struct sim_pin {
	struct nvidia_p2p_page_table pt;	/* what the client sees */
	struct nvidia_p2p_page *entries;
	struct nvidia_p2p_page **ptrs;
	struct sim_alloc *alloc;
	u64 va;
	u64 len;
	bool persistent;
	pid_t tgid;			/* the pinning process (RM looks it up by pid) */
	void (*free_callback)(void *data);
	void *data;
	enum sim_pin_state state;
	bool table_freed;
	struct task_struct *cb_task;	/* dispatching its callback */
	unsigned int waiters;		/* put_pages waiting on REVOKING */
	struct list_head node;		/* sim_pins, or sim_tombstones */
	struct list_head revoke_node;
};

static DEFINE_MUTEX(sim_lock);		/* everything below */
static LIST_HEAD(sim_allocs);
static LIST_HEAD(sim_pins);
static LIST_HEAD(sim_tombstones);
static unsigned int sim_ntombstones;
static u64 sim_next_id = 1;
static struct nvp2p_sim_stats sim_stats;
static u64 sim_enomem_after;
static u64 sim_eio_next;
static u64 sim_cb_delay_us;
static u64 sim_put_enomem_next;
static u64 sim_get_delay_us;
static int sim_get_err;			/* the next get_pages fails with it */
static DECLARE_WAIT_QUEUE_HEAD(sim_wq);	/* a pin left SIM_PIN_REVOKING */

static u8 sim_gpu_uuid[NVIDIA_P2P_GPU_UUID_LEN] = "nvp2p_sim-GPU-0";

static void sim_alloc_release(struct kref *ref)
{
	struct sim_alloc *a = container_of(ref, struct sim_alloc, ref);

	unpin_user_pages_dirty_lock(a->pages, a->npages, true);
	kvfree(a->pages);
	mmdrop(a->mm);
	sim_stats.allocations--;
	kfree(a);
}

/* Caller holds sim_lock. */
static void sim_alloc_put(struct sim_alloc *a)
{
	kref_put(&a->ref, sim_alloc_release);
}

static void sim_pin_free_entries(struct sim_pin *pin)
{
	kvfree(pin->entries);
	kvfree(pin->ptrs);
	pin->entries = NULL;
	pin->ptrs = NULL;
	/* A client reading a handed-back page table faults or sees nonsense. */
	pin->pt.pages = NULL;
	pin->pt.entries = 0;
	pin->pt.version = 0xdeaddead;
	pin->pt.gpu_uuid = NULL;
}

/* Caller holds sim_lock; pin is on no list. */
static void sim_pin_destroy(struct sim_pin *pin)
{
	sim_pin_free_entries(pin);
	if (pin->alloc)
		sim_alloc_put(pin->alloc);
	kfree(pin);
}

/* Caller holds sim_lock. */
static struct sim_pin *sim_find(struct list_head *list,
				const struct nvidia_p2p_page_table *pt)
{
	struct sim_pin *pin;

	list_for_each_entry(pin, list, node)
		if (&pin->pt == pt)
			return pin;
	return NULL;
}

/* Caller holds sim_lock. */
static struct sim_alloc *sim_find_alloc(u64 va, u64 len)
{
	struct sim_alloc *a;

	list_for_each_entry(a, &sim_allocs, node)
		if (a->mm == current->mm && va >= a->va &&
		    va + len <= a->va + a->len)
			return a;
	return NULL;
}

/* Caller holds sim_lock. Does [va, va + len) meet a live allocation of ours? */
static bool sim_overlaps(u64 va, u64 len)
{
	struct sim_alloc *a;

	list_for_each_entry(a, &sim_allocs, node)
		if (a->mm == current->mm && va < a->va + a->len &&
		    a->va < va + len)
			return true;
	return false;
}

/* Caller holds sim_lock; pin has just become a tombstone. */
static void sim_add_tombstone(struct sim_pin *pin)
{
	struct sim_pin *old, *tmp;

	list_move_tail(&pin->node, &sim_tombstones);
	sim_ntombstones++;
	list_for_each_entry_safe(old, tmp, &sim_tombstones, node) {
		if (sim_ntombstones <= SIM_MAX_TOMBSTONES)
			break;
		if (old->waiters)
			continue;
		list_del(&old->node);
		sim_ntombstones--;
		sim_pin_destroy(old);
	}
}

/* Sleep for an injected delay (or part of one). */
static void sim_cb_delay(u64 us)
{
	if (us)
		usleep_range(us, us + us / 4 + 1);
}

/* Caller holds sim_lock. The injected put_pages failure, if one is due. */
static bool sim_put_fails(void)
{
	if (!sim_put_enomem_next)
		return false;
	sim_put_enomem_next--;
	return true;
}

static int sim_get_pages(u64 va, u64 len, struct nvidia_p2p_page_table **ptp,
			 void (*free_callback)(void *data), void *data,
			 bool persistent)
{
	struct sim_alloc *a;
	struct sim_pin *pin;
	unsigned long first, step;
	u64 i, n, delay;
	int ret;

	/* NVIDIA dereferences a NULL ptp; its RM refuses an unaligned va
	 * (NV_ERR_INVALID_ARGUMENT) and rounds a partial last page up: both
	 * refused here. */
	if (!ptp)
		return -EINVAL;
	/* nv_p2p_get_pages(): *page_table = NULL before anything can fail. */
	*ptp = NULL;
	n = len / SIM_GPU_PAGE_SIZE;
	pin = kzalloc(sizeof(*pin), GFP_KERNEL);
	if (!pin)
		return -ENOMEM;	/* mem_info's allocation: *page_table stays NULL */
	/* The RM's checks come after *page_table = &mem_info->page_table. */
	ret = -EINVAL;
	if (!len || !IS_ALIGNED(va, SIM_GPU_PAGE_SIZE) ||
	    !IS_ALIGNED(len, SIM_GPU_PAGE_SIZE) || va + len < va ||
	    len > SIM_MAX_ALLOC)
		goto free_pin;
	ret = -ENOTSUPP;
	if (enotsupp == 2 || (enotsupp == 1 && persistent))
		goto free_pin;
	pin->entries = kvcalloc(n, sizeof(*pin->entries), GFP_KERNEL);
	pin->ptrs = kvcalloc(n, sizeof(*pin->ptrs), GFP_KERNEL);
	if (!pin->entries || !pin->ptrs) {
		ret = -ENOMEM;
		goto free_pin;
	}

	mutex_lock(&sim_lock);
	if (sim_get_err) {
		ret = sim_get_err;
		sim_get_err = 0;
		goto unlock;
	}
	if (sim_eio_next) {
		sim_eio_next--;
		ret = -EIO;
		goto unlock;
	}
	if (sim_enomem_after &&
	    sim_stats.outstanding_pins + sim_stats.outstanding_persistent >=
	    sim_enomem_after) {
		ret = -ENOMEM;	/* NV_ERR_INSUFFICIENT_RESOURCES: BAR1 full */
		goto unlock;
	}
	a = sim_find_alloc(va, len);
	if (!a) {
		ret = -EINVAL;	/* NV_ERR_INVALID_ARGUMENT / OBJECT_NOT_FOUND */
		goto unlock;
	}

	first = (va - a->va) >> PAGE_SHIFT;
	step = SIM_GPU_PAGE_SIZE >> PAGE_SHIFT;
	for (i = 0; i < n; i++) {
		pin->entries[i].physical_address =
			page_to_phys(a->pages[first + i * step]);
		pin->ptrs[i] = &pin->entries[i];
	}
	pin->pt.version = READ_ONCE(page_table_version);
	pin->pt.page_size = NVIDIA_P2P_PAGE_SIZE_64KB;
	pin->pt.pages = pin->ptrs;
	pin->pt.entries = n;
	pin->pt.gpu_uuid = sim_gpu_uuid;
	pin->va = va;
	pin->len = len;
	pin->persistent = persistent;
	pin->tgid = current->tgid;
	pin->free_callback = free_callback;
	pin->data = data;
	pin->state = SIM_PIN_LIVE;
	kref_get(&a->ref);
	pin->alloc = a;
	list_add_tail(&pin->node, &sim_pins);
	if (persistent)
		sim_stats.outstanding_persistent++;
	else
		sim_stats.outstanding_pins++;
	sim_stats.total_pins++;
	/*
	 * Published before any callback can fire: FREE needs sim_lock. NVIDIA
	 * stores *page_table first of all and registers the callback last
	 * (rm_p2p_register_callback()), in its own API-lock section: a free
	 * can call back between that and get_pages' return.
	 */
	*ptp = &pin->pt;
	delay = sim_get_delay_us;
	mutex_unlock(&sim_lock);
	/* The callback is armed: a FREE now calls back before we return. */
	sim_cb_delay(delay);
	return 0;

unlock:
	mutex_unlock(&sim_lock);
free_pin:
	kvfree(pin->entries);
	kvfree(pin->ptrs);
	kfree(pin);
	/* NVIDIA's failure path frees mem_info but leaves *page_table at it. */
	*ptp = SIM_POISON_PT;
	return ret;
}

int nvidia_p2p_get_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address, uint64_t length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	/* nvidia_p2p_get_pages(): a NULL callback is -EINVAL. p2p tokens and
	 * VA space tokens (deprecated) are not simulated. */
	if (!free_callback || p2p_token || va_space)
		return -EINVAL;
	return sim_get_pages(virtual_address, length, page_table,
			     free_callback, data, false);
}
EXPORT_SYMBOL(nvidia_p2p_get_pages);

int nvidia_p2p_get_pages_persistent(uint64_t virtual_address, uint64_t length,
				    struct nvidia_p2p_page_table **page_table,
				    uint32_t flags)
{
	/* 535's nvidia_p2p_get_pages_persistent(): flags != 0 is -EINVAL
	 * (later drivers accept NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING). */
	if (flags)
		return -EINVAL;
	return sim_get_pages(virtual_address, length, page_table, NULL, NULL,
			     true);
}
EXPORT_SYMBOL(nvidia_p2p_get_pages_persistent);

/*
 * FAULT_PUT_GATE: hold put_pages here, outside sim_lock, while the gate is
 * closed (30 s at most), so that a test can look at what else may run while a
 * client is inside put_pages (issue 31 #9: another owner's ioctl).
 */
static bool sim_put_gate;
static atomic_t sim_put_gated = ATOMIC_INIT(0);
static DECLARE_WAIT_QUEUE_HEAD(sim_gate_wq);

static void sim_put_gate_wait(void)
{
	if (!READ_ONCE(sim_put_gate))
		return;
	atomic_inc(&sim_put_gated);
	wait_event_timeout(sim_gate_wq, !READ_ONCE(sim_put_gate), SIM_PUT_GATE_MAX);
	atomic_dec(&sim_put_gated);
}

static void sim_put_gate_set(bool closed)
{
	WRITE_ONCE(sim_put_gate, closed);
	if (!closed)
		wake_up_all(&sim_gate_wq);
}

/* Caller holds sim_lock. Is current dispatching a callback? */
static bool sim_in_callback(void)
{
	struct sim_pin *pin;

	list_for_each_entry(pin, &sim_pins, node)
		if (pin->state == SIM_PIN_REVOKING && pin->cb_task == current)
			return true;
	return false;
}

int nvidia_p2p_put_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address,
			 struct nvidia_p2p_page_table *page_table)
{
	struct sim_pin *pin;

	/* nvidia_p2p_put_pages(): NULL is 0. */
	if (!page_table)
		return 0;

	sim_put_gate_wait();
	mutex_lock(&sim_lock);
	if (sim_in_callback()) {
		mutex_unlock(&sim_lock);
		WARN(1, "nvp2p_sim: %s called from a free callback\n", __func__);
		return -EINVAL;
	}
	/* nv_kmem_cache_alloc_stack() failing: -ENOMEM, nothing done. */
	if (sim_put_fails()) {
		mutex_unlock(&sim_lock);
		return -ENOMEM;
	}
	/* The virtual address is not used to find the table (RmP2PPutPages()
	 * looks it up by the table pointer alone). */
	pin = sim_find(&sim_pins, page_table);
	if (pin && pin->persistent) {
		mutex_unlock(&sim_lock);
		pr_err("put_pages on a persistent page table (va 0x%llx)\n",
		       virtual_address);
		return -EINVAL;
	}
	if (pin) {
		/* The RM API lock: wait out a teardown dispatching our callback. */
		pin->waiters++;
		if (pin->state == SIM_PIN_REVOKING)
			race_put_waited++;
		while (pin->state == SIM_PIN_REVOKING) {
			mutex_unlock(&sim_lock);
			wait_event(sim_wq, READ_ONCE(pin->state) != SIM_PIN_REVOKING);
			mutex_lock(&sim_lock);
		}
		pin->waiters--;
		if (pin->state == SIM_PIN_LIVE) {
			if (pin->tgid != current->tgid) {
				/* Not among this pid's RM clients: "not
				 * found", which nv_p2p_put_pages() turns
				 * into success. Nothing is released. */
				put_foreign++;
				mutex_unlock(&sim_lock);
				pr_info_ratelimited("put_pages of va 0x%llx from pid %d, pinned by %d: 0, nothing released\n",
						    pin->va, current->tgid, pin->tgid);
				return 0;
			}
			list_del(&pin->node);
			sim_stats.outstanding_pins--;
			sim_pin_destroy(pin);
			mutex_unlock(&sim_lock);
			return 0;
		}
	} else {
		pin = sim_find(&sim_tombstones, page_table);
		if (pin)
			race_put_late++;
	}
	/* Its callback took it: NV_ERR_OBJECT_NOT_FOUND, reported as 0. */
	if (pin && !pin->waiters) {
		list_del(&pin->node);
		sim_ntombstones--;
		sim_pin_destroy(pin);
	}
	mutex_unlock(&sim_lock);
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_put_pages);

int nvidia_p2p_put_pages_persistent(uint64_t virtual_address,
				    struct nvidia_p2p_page_table *page_table,
				    uint32_t flags)
{
	struct sim_pin *pin;

	/* nvidia_p2p_put_pages_persistent(): flags first, then NULL is 0. */
	if (flags)
		return -EINVAL;
	if (!page_table)
		return 0;
	mutex_lock(&sim_lock);
	if (sim_put_fails()) {
		mutex_unlock(&sim_lock);
		return -ENOMEM;
	}
	pin = sim_find(&sim_pins, page_table);
	if (!pin || !pin->persistent || pin->va != virtual_address) {
		mutex_unlock(&sim_lock);
		pr_err("put_pages_persistent: no such persistent page table\n");
		return -EINVAL;
	}
	list_del(&pin->node);
	sim_stats.outstanding_persistent--;
	sim_pin_destroy(pin);
	mutex_unlock(&sim_lock);
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_put_pages_persistent);

/*
 * Called by the client's free callback. Older drivers freed the page table
 * here and could sleep: count a call from atomic context (preempt_count is
 * kept by every kernel this runs on: CONFIG_PREEMPT_COUNT).
 */
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table)
{
	struct sim_pin *pin;

	/* A no-op returning 0 in the open driver: the checks only report. */
	if (!page_table)
		return 0;
	if (irqs_disabled() || preempt_count()) {
		free_table_atomic++;
		pr_err_ratelimited("nvidia_p2p_free_page_table called with interrupts or preemption disabled\n");
	}
	pin = container_of(page_table, struct sim_pin, pt);
	if (READ_ONCE(pin->state) != SIM_PIN_REVOKING ||
	    pin->cb_task != current) {
		WARN(1, "nvp2p_sim: %s outside its free callback\n", __func__);
		return 0;
	}
	WRITE_ONCE(pin->table_freed, true);
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_free_page_table);

int nvidia_p2p_dma_map_pages(struct pci_dev *peer,
			     struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping)
{
	struct nvidia_p2p_dma_mapping *m;
	u32 i;

	if (!peer || !page_table || !dma_mapping || !page_table->gpu_uuid)
		return -EINVAL;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->dma_addresses = kvcalloc(page_table->entries,
				    sizeof(*m->dma_addresses), GFP_KERNEL);
	if (!m->dma_addresses) {
		kfree(m);
		return -ENOMEM;
	}
	/* No IOMMU here: bus address = physical address. */
	for (i = 0; i < page_table->entries; i++)
		m->dma_addresses[i] = page_table->pages[i]->physical_address;
	m->version = NVIDIA_P2P_DMA_MAPPING_VERSION;
	m->page_size_type = page_table->page_size;
	m->entries = page_table->entries;
	m->pci_dev = peer;
	*dma_mapping = m;
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_dma_map_pages);

int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer,
			       struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping)
{
	if (!peer || !page_table || !dma_mapping)
		return -EINVAL;
	WARN_ON(peer != dma_mapping->pci_dev);
	kvfree(dma_mapping->dma_addresses);
	kfree(dma_mapping);
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_dma_unmap_pages);

/* A no-op returning 0 in NVIDIA's driver too: unmap frees the mapping. */
int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping)
{
	return 0;
}
EXPORT_SYMBOL(nvidia_p2p_free_dma_mapping);

/*
 * The allocation is off the live lists: fire the free callback of every
 * callback-mode pin on it, one after the other, without sim_lock held (as
 * NVIDIA's driver does from cuMemFree). put_pages on a pin being revoked
 * waits until its dispatch is over.
 */
static void sim_revoke_alloc(struct sim_alloc *a)
{
	struct sim_pin *pin, *tmp;
	LIST_HEAD(victims);
	u64 delay;

	mutex_lock(&sim_lock);
	list_for_each_entry(pin, &sim_pins, node) {
		if (pin->persistent || pin->alloc != a ||
		    pin->state != SIM_PIN_LIVE)
			continue;
		pin->state = SIM_PIN_REVOKING;
		pin->cb_task = current;
		list_add_tail(&pin->revoke_node, &victims);
	}
	delay = sim_cb_delay_us;
	mutex_unlock(&sim_lock);

	list_for_each_entry_safe(pin, tmp, &victims, revoke_node) {
		sim_cb_delay(delay / 2);
		pin->free_callback(pin->data);
		sim_cb_delay(delay - delay / 2);
		if (!READ_ONCE(pin->table_freed)) {
			/* One stack trace, then one line per offence. */
			WARN_ONCE(1, "nvp2p_sim: free callback returned without nvidia_p2p_free_page_table\n");
			pr_err_ratelimited("WARNING: free callback of va 0x%llx returned without nvidia_p2p_free_page_table\n",
					   pin->va);
		}

		mutex_lock(&sim_lock);
		list_del(&pin->revoke_node);
		sim_pin_free_entries(pin);
		sim_alloc_put(pin->alloc);
		pin->alloc = NULL;
		pin->cb_task = NULL;
		WRITE_ONCE(pin->state, SIM_PIN_REVOKED);
		sim_add_tombstone(pin);
		sim_stats.outstanding_pins--;
		sim_stats.callbacks_fired++;
		mutex_unlock(&sim_lock);
		wake_up_all(&sim_wq);
	}
}

/* Caller holds sim_lock: take a off the live lists (the lists' ref is kept). */
static void sim_unlink_alloc(struct sim_alloc *a)
{
	list_del(&a->node);
	list_del(&a->ctl_node);
}

static long sim_ioctl_alloc(struct sim_ctl *ctl, void __user *uarg)
{
	struct nvp2p_sim_alloc arg;
	struct sim_alloc *a;
	unsigned long done = 0;
	long ret;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.reserved || !arg.len ||
	    !IS_ALIGNED(arg.va, SIM_GPU_PAGE_SIZE) ||
	    !IS_ALIGNED(arg.len, SIM_GPU_PAGE_SIZE) ||
	    arg.va + arg.len < arg.va || arg.len > SIM_MAX_ALLOC)
		return -EINVAL;

	a = kzalloc(sizeof(*a), GFP_KERNEL);
	if (!a)
		return -ENOMEM;
	a->npages = arg.len >> PAGE_SHIFT;
	a->pages = kvcalloc(a->npages, sizeof(*a->pages), GFP_KERNEL);
	if (!a->pages) {
		ret = -ENOMEM;
		goto free_alloc;
	}
	while (done < a->npages) {
		ret = pin_user_pages_fast(arg.va + (done << PAGE_SHIFT),
					  a->npages - done,
					  FOLL_WRITE | FOLL_LONGTERM,
					  a->pages + done);
		if (ret <= 0) {
			ret = ret ? ret : -EFAULT;
			goto unpin_pages;
		}
		done += ret;
	}

	kref_init(&a->ref);
	a->ctl = ctl;
	a->va = arg.va;
	a->len = arg.len;
	mmgrab(current->mm);
	a->mm = current->mm;

	mutex_lock(&sim_lock);
	if (sim_overlaps(arg.va, arg.len)) {
		mutex_unlock(&sim_lock);
		ret = -EEXIST;
		goto drop_mm;
	}
	a->id = sim_next_id++;
	list_add_tail(&a->node, &sim_allocs);
	list_add_tail(&a->ctl_node, &ctl->allocs);
	sim_stats.allocations++;
	arg.id = a->id;
	mutex_unlock(&sim_lock);

	if (copy_to_user(uarg, &arg, sizeof(arg)))
		return -EFAULT;	/* stays allocated until FREE or close */
	return 0;

drop_mm:
	mmdrop(a->mm);
unpin_pages:
	unpin_user_pages(a->pages, done);
	kvfree(a->pages);
free_alloc:
	kfree(a);
	return ret;
}

static long sim_ioctl_free(struct sim_ctl *ctl, void __user *uarg)
{
	struct nvp2p_sim_free arg;
	struct sim_alloc *a, *found = NULL;

	if (copy_from_user(&arg, uarg, sizeof(arg)))
		return -EFAULT;
	if (arg.reserved)
		return -EINVAL;

	mutex_lock(&sim_lock);
	list_for_each_entry(a, &ctl->allocs, ctl_node) {
		if (a->id == arg.id) {
			found = a;
			sim_unlink_alloc(a);
			break;
		}
	}
	mutex_unlock(&sim_lock);
	if (!found)
		return -ENOENT;

	sim_revoke_alloc(found);
	mutex_lock(&sim_lock);
	sim_alloc_put(found);
	mutex_unlock(&sim_lock);
	return 0;
}

static long sim_ioctl_set_fault(void __user *uarg)
{
	struct nvp2p_sim_fault f;
	long ret = 0;

	if (copy_from_user(&f, uarg, sizeof(f)))
		return -EFAULT;
	if (f.reserved)
		return -EINVAL;
	mutex_lock(&sim_lock);
	switch (f.type) {
	case NVP2P_SIM_FAULT_NONE:
		sim_enomem_after = 0;
		sim_eio_next = 0;
		sim_cb_delay_us = 0;
		sim_put_enomem_next = 0;
		sim_get_delay_us = 0;
		sim_get_err = 0;
		sim_put_gate_set(false);
		break;
	case NVP2P_SIM_FAULT_PUT_GATE:
		if (f.value > 1)
			ret = -EINVAL;
		else
			sim_put_gate_set(f.value);
		break;
	case NVP2P_SIM_FAULT_ENOMEM_AFTER:
		sim_enomem_after = f.value;
		break;
	case NVP2P_SIM_FAULT_EIO_NEXT:
		sim_eio_next = f.value;
		break;
	case NVP2P_SIM_FAULT_CALLBACK_DELAY:
		if (f.value > SIM_MAX_CB_DELAY_US)
			ret = -EINVAL;
		else
			sim_cb_delay_us = f.value;
		break;
	case NVP2P_SIM_FAULT_PUT_ENOMEM:
		sim_put_enomem_next = f.value;
		break;
	case NVP2P_SIM_FAULT_GET_DELAY:
		if (f.value > SIM_MAX_CB_DELAY_US)
			ret = -EINVAL;
		else
			sim_get_delay_us = f.value;
		break;
	case NVP2P_SIM_FAULT_GET_ERR:
		/* Only what nvidia_p2p_map_status() can return. */
		switch (f.value) {
		case 0: case EINVAL: case ENOMEM: case EIO: case ENOTSUPP:
		case EBUSY: case ENODEV:
			sim_get_err = -(int)f.value;
			break;
		default:
			ret = -EINVAL;
		}
		break;
	default:
		ret = -EINVAL;
		break;
	}
	mutex_unlock(&sim_lock);
	return ret;
}

static long sim_ioctl_get_stats(void __user *uarg)
{
	struct nvp2p_sim_stats s;

	mutex_lock(&sim_lock);
	s = sim_stats;
	mutex_unlock(&sim_lock);
	s.put_gated = atomic_read(&sim_put_gated);
	if (copy_to_user(uarg, &s, sizeof(s)))
		return -EFAULT;
	return 0;
}

static long sim_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct sim_ctl *ctl = filp->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case NVP2P_SIM_IOCTL_ALLOC:
		return sim_ioctl_alloc(ctl, uarg);
	case NVP2P_SIM_IOCTL_FREE:
		return sim_ioctl_free(ctl, uarg);
	case NVP2P_SIM_IOCTL_SET_FAULT:
		return sim_ioctl_set_fault(uarg);
	case NVP2P_SIM_IOCTL_GET_STATS:
		return sim_ioctl_get_stats(uarg);
	default:
		return -ENOTTY;
	}
}

static int sim_open(struct inode *inode, struct file *filp)
{
	struct sim_ctl *ctl;

	ctl = kzalloc(sizeof(*ctl), GFP_KERNEL);
	if (!ctl)
		return -ENOMEM;
	INIT_LIST_HEAD(&ctl->allocs);
	filp->private_data = ctl;
	return nonseekable_open(inode, filp);
}

/* Closing the control file (the process exiting) frees its allocations. */
static int sim_release(struct inode *inode, struct file *filp)
{
	struct sim_ctl *ctl = filp->private_data;
	struct sim_alloc *a;

	for (;;) {
		mutex_lock(&sim_lock);
		a = list_first_entry_or_null(&ctl->allocs, struct sim_alloc,
					     ctl_node);
		if (a)
			sim_unlink_alloc(a);
		mutex_unlock(&sim_lock);
		if (!a)
			break;
		sim_revoke_alloc(a);
		mutex_lock(&sim_lock);
		sim_alloc_put(a);
		mutex_unlock(&sim_lock);
	}
	kfree(ctl);
	return 0;
}

static const struct file_operations sim_fops = {
	.owner		= THIS_MODULE,
	.open		= sim_open,
	.release	= sim_release,
	.unlocked_ioctl	= sim_ioctl,
	.compat_ioctl	= compat_ptr_ioctl,
};

static struct miscdevice sim_misc = {
	.minor	= MISC_DYNAMIC_MINOR,
	.name	= "nvp2p_sim",
	.fops	= &sim_fops,
	.mode	= 0666,
};

static int __init sim_init(void)
{
	int ret;

	ret = misc_register(&sim_misc);
	if (ret)
		pr_err("misc_register: %d\n", ret);
	return ret;
}

static void __exit sim_exit(void)
{
	struct sim_pin *pin, *tmp;

	misc_deregister(&sim_misc);
	/* Clients that import our symbols are gone: only tombstones remain. */
	WARN_ON(!list_empty(&sim_pins) || !list_empty(&sim_allocs));
	list_for_each_entry_safe(pin, tmp, &sim_tombstones, node) {
		list_del(&pin->node);
		kfree(pin);
	}
}

module_init(sim_init);
module_exit(sim_exit);

MODULE_DESCRIPTION("Simulated NVIDIA P2P provider for gdrcache tests (not for production)");
MODULE_LICENSE("GPL");
