/* SPDX-License-Identifier: MIT */
/*
 * A fake libibverbs.so.1 for the preload's host tests (no RDMA device here): the symbols and
 * version nodes of rdma-core's libibverbs that the preload, libgdrcache and the tests use, over
 * one fake device whose MRs are plain records. It mirrors what matters to the interposer:
 *  - versioned entry points (fake_ibverbs.map), the 1.1 registration functions reaching
 *    ibv_reg_mr_iova2 through the PLT as rdma-core's do, and an IBVERBS_1.0 layer whose functions
 *    call the 1.1 ones through the PLT (rdma-core's 1.0 layer also wraps 1.0-layout objects; this
 *    one keeps today's layouts);
 *  - ibv_dereg_mr of anything that is not one of its MRs fails with EINVAL (so a shadow MR handed
 *    to it is caught), ibv_dealloc_pd of a PD with MRs fails with EBUSY (as the kernel does), and
 *    ibv_close_device counts the MRs still registered on it;
 *  - the kernel's and libibverbs' answers to bad requests: remote write or atomic access without
 *    local write is EINVAL; ibv_rereg_mr checks its input as libibverbs does, then answers as a
 *    provider that re-registers (flags 0: IBV_REREG_MR_ERR_CMD, EINVAL, as the kernel refuses
 *    it) or, after fake_ibv_set_rereg(0), as rxe and siw do (IBV_REREG_MR_ERR_CMD, EOPNOTSUPP);
 *  - fork() at any time: its one lock is taken around it (pthread_atfork), as a program that
 *    forks while other threads register needs of a real libibverbs;
 *  - the rest of what NCCL resolves (preload/nccl_verbs.h), so that its loader finds every verb:
 *    one active port, no CQ or QP (creation refused), no ECE (IBVERBS_1.10);
 *  - today's rdma-core nodes (fake_ibverbs_new.map): ibv_reg_mr_ex (IBVERBS_1.15),
 *    ibv_query_port_speed (IBVERBS_1.16), ibv_alloc_buf, ibv_free_buf, ibv_reg_buf_mr
 *    (IBVERBS_1.17), reg_buf_mr reaching ibv_reg_mr_ex through the PLT as in rdma-core. Built with
 *    FAKE_RDMA_CORE_44 it stops at IBVERBS_1.12, as Debian 12's;
 *  - built with FAKE_RELRO_WRITABLE (linked -z now, as distributions link libibverbs): its
 *    constructor leaves the pages of its RELRO segment writable, as the loader does where the
 *    segment's last page also holds .data (64 KiB pages, aarch64): what a 4 KiB-page machine never
 *    shows, SIMULATED, for the preload's write to its relocation slot;
 *  - a freed PD's address is handed out again at once (pd_pool), and a test may run code of its own
 *    at two points (fake_ibv_set_hooks): once ibv_dealloc_pd has freed a PD (before it returns),
 *    and as ibv_rereg_mr starts, for an interleaving with another thread's call.
 * Tests read its counters through fake_ibv_* (FAKE_IBVERBS node), found with dlsym.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef FAKE_RELRO_WRITABLE
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

static int relro_writable(struct dl_phdr_info *info, size_t size, void *self)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);

	(void)size;
	if ((void *)info->dlpi_addr != self)
		return 0;
	for (unsigned i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
			uintptr_t a = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
			uintptr_t e = a + info->dlpi_phdr[i].p_memsz;

			a &= ~(page - 1);
			mprotect((void *)a, ((e + page - 1) & ~(page - 1)) - a,
				 PROT_READ | PROT_WRITE);
		}
	}
	return 1;
}

/* Before any library that needs this one runs its constructor (the preload's included). */
__attribute__((constructor)) static void relro_left_writable(void)
{
	Dl_info di;

	if (dladdr((void *)relro_left_writable, &di))
		dl_iterate_phdr(relro_writable, di.dli_fbase);
}
#endif

#define EXPORT __attribute__((visibility("default")))
#define VERSIONED(name) __attribute__((visibility("default"), symver(name)))
#define MR_MAGIC 0x4d52u
#define PD_MAGIC 0x5044u

struct fake_mr {
	struct ibv_mr mr;
	unsigned magic;
	int access;
	uint64_t iova;
	struct fake_mr *next;
};

struct fake_pd {
	struct ibv_pd pd;
	unsigned magic;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct fake_mr *mrs;
static uint32_t next_key = 0x1000;
static uint32_t next_handle = 1;
static struct ibv_device device;
/* PDs come from a static pool, so that a PD a test leaves behind at ibv_close_device (as the kernel
 * would free it) is no leak; a freed one is reused at once, at the same address. */
static struct fake_pd pd_pool[64];

enum {
	C_REG,
	C_REG_1_0,
	C_DEREG,
	C_DEREG_1_0,
	C_DMABUF,
	C_REREG,
	C_DEALLOC_PD,
	C_DEALLOC_PD_1_0,
	C_CLOSE,
	C_CLOSE_1_0,
	C_CLOSE_LEFT,
	C_DEREG_BAD,
	C_REG_EX,
	C_REG_BUF,
	C_N
};
static const char *const names[C_N] = {
	"reg",        "reg_1_0",    "dereg",          "dereg_1_0", "dmabuf",
	"rereg",      "dealloc_pd", "dealloc_pd_1_0", "close",     "close_1_0",
	"close_left", "dereg_bad",  "reg_ex",         "reg_buf",
};
static uint64_t counts[C_N];
static int rereg_supported = 1;
/* fake_ibv_set_hooks: called on the caller's thread, outside the lock */
static void (*after_dealloc_hook)(struct ibv_pd *pd);
static void (*before_rereg_hook)(struct ibv_mr *mr);

static void count(int c)
{
	__atomic_fetch_add(&counts[c], 1, __ATOMIC_RELAXED);
}

/* fork() while other threads register: the child's one thread must find the lock free. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void fork_done(void)
{
	pthread_mutex_unlock(&lock);
}

__attribute__((constructor)) static void fake_init(void)
{
	pthread_atfork(fork_prepare, fork_done, fork_done);
}

/* ---- Control API (FAKE_IBVERBS) ----------------------------------------------------------------- */

/* A counter by name ("reg", "dereg", ...; see names[]), or UINT64_MAX for an unknown name. */
EXPORT uint64_t fake_ibv_count(const char *name)
{
	for (int i = 0; i < C_N; i++)
		if (!strcmp(name, names[i]))
			return __atomic_load_n(&counts[i], __ATOMIC_RELAXED);
	return UINT64_MAX;
}

/* MRs registered now on pd (NULL: on every PD). */
EXPORT unsigned fake_ibv_live_mrs(const struct ibv_pd *pd)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (struct fake_mr *m = mrs; m; m = m->next)
		n += !pd || m->mr.pd == pd;
	pthread_mutex_unlock(&lock);
	return n;
}

/* Whether mr is one of this library's live MRs (not a shadow made by someone else). */
EXPORT int fake_ibv_is_mr(const struct ibv_mr *mr)
{
	int found = 0;

	pthread_mutex_lock(&lock);
	for (struct fake_mr *m = mrs; m && !found; m = m->next)
		found = &m->mr == mr;
	pthread_mutex_unlock(&lock);
	return found;
}

/* The access flags and iova a live MR was registered with; -ENOENT if it is not one. */
EXPORT int fake_ibv_mr_info(const struct ibv_mr *mr, int *access, uint64_t *iova)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&lock);
	for (struct fake_mr *m = mrs; m; m = m->next) {
		if (&m->mr == mr) {
			*access = m->access;
			*iova = m->iova;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* The iova, length and access of the live MR whose lkey is lkey (a shadow's MR is found by the
 * keys it carries); -ENOENT if none. */
EXPORT int fake_ibv_mr_by_lkey(uint32_t lkey, uint64_t *iova, uint64_t *len, int *access)
{
	int rc = -ENOENT;

	pthread_mutex_lock(&lock);
	for (struct fake_mr *m = mrs; m; m = m->next) {
		if (m->mr.lkey == lkey) {
			*iova = m->iova;
			*len = m->mr.length;
			*access = m->access;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	return rc;
}

/* 1: ibv_rereg_mr re-registers (mlx5); 0: it answers as rxe and siw do (no rereg). */
EXPORT void fake_ibv_set_rereg(int supported)
{
	__atomic_store_n(&rereg_supported, supported, __ATOMIC_RELAXED);
}

/* Code of the test's own, run on the calling thread, outside the lock (NULL: none): after_dealloc
 * once ibv_dealloc_pd has freed pd (its address may be handed out again) and before it returns 0;
 * before_rereg as ibv_rereg_mr starts, before it looks at mr. */
EXPORT void fake_ibv_set_hooks(void (*after_dealloc)(struct ibv_pd *pd),
			       void (*before_rereg)(struct ibv_mr *mr))
{
	__atomic_store_n(&after_dealloc_hook, after_dealloc, __ATOMIC_RELEASE);
	__atomic_store_n(&before_rereg_hook, before_rereg, __ATOMIC_RELEASE);
}

/* ---- Devices, contexts, PDs ------------------------------------------------------------------------ */

VERSIONED("ibv_get_device_list@@IBVERBS_1.1")
struct ibv_device **fake_get_device_list(int *num)
{
	struct ibv_device **l = calloc(2, sizeof(*l));

	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	strcpy(device.name, "fake0");
	strcpy(device.dev_name, "fake0");
	l[0] = &device;
	if (num)
		*num = 1;
	return l;
}

VERSIONED("ibv_free_device_list@@IBVERBS_1.1")
void fake_free_device_list(struct ibv_device **list)
{
	free(list);
}

VERSIONED("ibv_get_device_name@@IBVERBS_1.1")
const char *fake_get_device_name(struct ibv_device *d)
{
	return d->name;
}

VERSIONED("ibv_open_device@@IBVERBS_1.1")
struct ibv_context *fake_open_device(struct ibv_device *d)
{
	struct ibv_context *c = calloc(1, sizeof(*c));

	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->device = d;
	c->cmd_fd = -1;
	c->async_fd = -1;
	return c;
}

static unsigned mrs_on_context(const struct ibv_context *c)
{
	unsigned n = 0;

	pthread_mutex_lock(&lock);
	for (struct fake_mr *m = mrs; m; m = m->next)
		n += m->mr.context == c;
	pthread_mutex_unlock(&lock);
	return n;
}

VERSIONED("ibv_close_device@@IBVERBS_1.1")
int fake_close_device(struct ibv_context *c)
{
	unsigned left = mrs_on_context(c);

	count(C_CLOSE);
	__atomic_fetch_add(&counts[C_CLOSE_LEFT], left, __ATOMIC_RELAXED);
	/* The kernel frees the device's MRs with it: forget them (their memory leaks, as it does in
	 * rdma-core when a program closes a device with MRs registered). */
	pthread_mutex_lock(&lock);
	for (struct fake_mr **p = &mrs; *p;) {
		if ((*p)->mr.context == c) {
			struct fake_mr *m = *p;

			*p = m->next;
			m->magic = 0;
			free(m);
		} else {
			p = &(*p)->next;
		}
	}
	for (unsigned i = 0; i < sizeof(pd_pool) / sizeof(pd_pool[0]); i++)
		if (pd_pool[i].magic == PD_MAGIC && pd_pool[i].pd.context == c)
			pd_pool[i].magic = 0;
	pthread_mutex_unlock(&lock);
	free(c);
	return 0;
}

VERSIONED("ibv_alloc_pd@@IBVERBS_1.1")
struct ibv_pd *fake_alloc_pd(struct ibv_context *c)
{
	struct fake_pd *p = NULL;

	pthread_mutex_lock(&lock);
	for (unsigned i = 0; i < sizeof(pd_pool) / sizeof(pd_pool[0]) && !p; i++)
		if (pd_pool[i].magic != PD_MAGIC)
			p = &pd_pool[i];
	if (p)
		p->magic = PD_MAGIC;
	pthread_mutex_unlock(&lock);
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	p->pd.context = c;
	p->pd.handle = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED);
	return &p->pd;
}

VERSIONED("ibv_dealloc_pd@@IBVERBS_1.1")
int fake_dealloc_pd(struct ibv_pd *pd)
{
	void (*hook)(struct ibv_pd *) = __atomic_load_n(&after_dealloc_hook, __ATOMIC_ACQUIRE);
	struct fake_pd *p = (struct fake_pd *)pd;

	count(C_DEALLOC_PD);
	if (!pd || p->magic != PD_MAGIC)
		return EINVAL;
	if (fake_ibv_live_mrs(pd))
		return EBUSY;
	pthread_mutex_lock(&lock);
	p->magic = 0;
	pthread_mutex_unlock(&lock);
	if (hook)
		hook(pd);
	return 0;
}

/* ---- Memory regions ---------------------------------------------------------------------------------- */

/* The kernel's ib_check_mr_access: remote write and atomic need local write. */
static int access_ok(int access)
{
	return !(access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) ||
	       (access & IBV_ACCESS_LOCAL_WRITE);
}

/* The provider's registration, which every entry point ends in. */
static struct ibv_mr *mr_new(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
			     unsigned int access)
{
	struct fake_mr *m;

	count(C_REG);
	if (!pd || ((struct fake_pd *)pd)->magic != PD_MAGIC || !len || !access_ok((int)access)) {
		errno = EINVAL;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->access = (int)access;
	m->iova = iova;
	m->magic = MR_MAGIC;
	pthread_mutex_lock(&lock);
	m->mr.handle = __atomic_fetch_add(&next_handle, 1, __ATOMIC_RELAXED); /* PDs' too */
	m->mr.lkey = next_key++;
	m->mr.rkey = next_key++;
	m->next = mrs;
	mrs = m;
	pthread_mutex_unlock(&lock);
	return &m->mr;
}

VERSIONED("ibv_reg_mr_iova2@@IBVERBS_1.8")
struct ibv_mr *fake_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				 unsigned int access)
{
	return mr_new(pd, addr, len, iova, access);
}

/* ibv_reg_mr / ibv_reg_mr_iova reach ibv_reg_mr_iova2 through the PLT, as in rdma-core. */
VERSIONED("ibv_reg_mr@@IBVERBS_1.1")
struct ibv_mr *fake_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	return ibv_reg_mr_iova2(pd, addr, len, (uintptr_t)addr, (unsigned)access);
}

VERSIONED("ibv_reg_mr_iova@@IBVERBS_1.7")
struct ibv_mr *fake_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
				int access)
{
	return ibv_reg_mr_iova2(pd, addr, len, iova, (unsigned)access);
}

VERSIONED("ibv_reg_dmabuf_mr@@IBVERBS_1.12")
struct ibv_mr *fake_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
				  int fd, int access)
{
	struct ibv_mr *mr;

	count(C_DMABUF);
	if (fd < 0) {
		errno = EBADF;
		return NULL;
	}
	mr = ibv_reg_mr_iova2(pd, (void *)(uintptr_t)offset, len, iova, (unsigned)access);
	if (mr)
		mr->addr = (void *)(uintptr_t)offset; /* as rdma-core sets a dma-buf MR's */
	return mr;
}

static struct fake_mr *unlink_mr(struct ibv_mr *mr)
{
	struct fake_mr *found = NULL;

	pthread_mutex_lock(&lock);
	for (struct fake_mr **p = &mrs; *p; p = &(*p)->next) {
		if (&(*p)->mr == mr) {
			found = *p;
			*p = found->next;
			break;
		}
	}
	pthread_mutex_unlock(&lock);
	return found;
}

VERSIONED("ibv_dereg_mr@@IBVERBS_1.1")
int fake_dereg_mr(struct ibv_mr *mr)
{
	struct fake_mr *m;

	count(C_DEREG);
	m = unlink_mr(mr);
	if (!m) {
		count(C_DEREG_BAD);
		return EINVAL;
	}
	m->magic = 0;
	free(m);
	return 0;
}

VERSIONED("ibv_rereg_mr@@IBVERBS_1.1")
int fake_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr, size_t len,
		  int access)
{
	void (*hook)(struct ibv_mr *) = __atomic_load_n(&before_rereg_hook, __ATOMIC_ACQUIRE);
	int found;

	if (hook)
		hook(mr);
	count(C_REREG);
	/* libibverbs' checks, in its order */
	found = fake_ibv_is_mr(mr);
	if (!found || flags & ~IBV_REREG_MR_FLAGS_SUPPORTED ||
	    ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (!len || !addr)) ||
	    (access && !(flags & IBV_REREG_MR_CHANGE_ACCESS))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_INPUT;
	}
	/* the provider's */
	if (!__atomic_load_n(&rereg_supported, __ATOMIC_RELAXED)) {
		errno = EOPNOTSUPP;
		return IBV_REREG_MR_ERR_CMD;
	}
	if (!flags || ((flags & IBV_REREG_MR_CHANGE_ACCESS) && !access_ok(access))) {
		errno = EINVAL;
		return IBV_REREG_MR_ERR_CMD;
	}
	if (flags & IBV_REREG_MR_CHANGE_PD)
		mr->pd = pd;
	if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
		mr->addr = addr;
		mr->length = len;
	}
	if (flags & IBV_REREG_MR_CHANGE_ACCESS)
		((struct fake_mr *)mr)->access = access;
	return 0;
}

/* ---- The rest of NCCL's table (preload/nccl_verbs.h): one port, no queues -------------------- */

VERSIONED("ibv_fork_init@@IBVERBS_1.1")
int fake_fork_init(void)
{
	return 0;
}

/* No event is ever pending: the answer of a non-blocking async_fd. */
VERSIONED("ibv_get_async_event@@IBVERBS_1.1")
int fake_get_async_event(struct ibv_context *c, struct ibv_async_event *e)
{
	(void)c, (void)e;
	errno = EAGAIN;
	return -1;
}

VERSIONED("ibv_ack_async_event@@IBVERBS_1.1")
void fake_ack_async_event(struct ibv_async_event *e)
{
	(void)e;
}

VERSIONED("ibv_event_type_str@@IBVERBS_1.1")
const char *fake_event_type_str(enum ibv_event_type t)
{
	(void)t;
	return "fake event";
}

VERSIONED("ibv_query_device@@IBVERBS_1.1")
int fake_query_device(struct ibv_context *c, struct ibv_device_attr *a)
{
	(void)c;
	memset(a, 0, sizeof(*a));
	strcpy(a->fw_ver, "fake");
	a->max_mr_size = UINT64_MAX;
	a->max_pd = sizeof(pd_pool) / sizeof(pd_pool[0]);
	a->phys_port_cnt = 1;
	return 0;
}

VERSIONED("ibv_query_port@@IBVERBS_1.1")
int fake_query_port(struct ibv_context *c, uint8_t port, struct ibv_port_attr *a)
{
	(void)c;
	if (port != 1)
		return EINVAL;
	memset(a, 0, sizeof(*a));
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 1;
	a->link_layer = IBV_LINK_LAYER_INFINIBAND;
	return 0;
}

VERSIONED("ibv_query_gid@@IBVERBS_1.1")
int fake_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid)
{
	(void)c;
	if (port != 1 || index != 0) {
		errno = EINVAL;
		return -1;
	}
	memset(gid, 0, sizeof(*gid));
	return 0;
}

/* The fake device makes no CQ or QP: creation is refused, and nothing is one. */
VERSIONED("ibv_create_cq@@IBVERBS_1.1")
struct ibv_cq *fake_create_cq(struct ibv_context *c, int cqe, void *cq_context,
			      struct ibv_comp_channel *channel, int comp_vector)
{
	(void)c, (void)cqe, (void)cq_context, (void)channel, (void)comp_vector;
	errno = EOPNOTSUPP;
	return NULL;
}

VERSIONED("ibv_destroy_cq@@IBVERBS_1.1")
int fake_destroy_cq(struct ibv_cq *cq)
{
	(void)cq;
	return EINVAL;
}

VERSIONED("ibv_create_qp@@IBVERBS_1.1")
struct ibv_qp *fake_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	(void)pd, (void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

VERSIONED("ibv_query_qp@@IBVERBS_1.1")
int fake_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
		  struct ibv_qp_init_attr *init)
{
	(void)qp, (void)attr, (void)mask, (void)init;
	return EINVAL;
}

VERSIONED("ibv_modify_qp@@IBVERBS_1.1")
int fake_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	(void)qp, (void)attr, (void)mask;
	return EINVAL;
}

VERSIONED("ibv_destroy_qp@@IBVERBS_1.1")
int fake_destroy_qp(struct ibv_qp *qp)
{
	(void)qp;
	return EINVAL;
}

/* A provider without ECE, as libibverbs answers for one (IBVERBS_1.10). */
VERSIONED("ibv_query_ece@@IBVERBS_1.10")
int fake_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return EOPNOTSUPP;
}

VERSIONED("ibv_set_ece@@IBVERBS_1.10")
int fake_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
	(void)qp, (void)ece;
	return EOPNOTSUPP;
}

/* ---- Today's rdma-core: IBVERBS_1.15, IBVERBS_1.16, IBVERBS_1.17 ----------------------------- */
#ifndef FAKE_RDMA_CORE_44
/* rdma-core's struct ibv_mr_init_attr and its mask bits (verbs.h of rdma-core 58 and later). */
struct fake_mr_init_attr {
	size_t length;
	int access;
	uint64_t comp_mask;
	uint64_t iova;
	void *addr;
	int fd;
	uint64_t fd_offset;
	void *dmah;
	void *buf;
};
enum {
	M_IOVA = 1 << 0,
	M_ADDR = 1 << 1,
	M_FD = 1 << 2,
	M_FD_OFFSET = 1 << 3,
	M_DMAH = 1 << 4,
	M_BUF = 1 << 5
};

struct fake_buf {
	void *addr;
	size_t size;
	struct ibv_pd *pd;
};

/* rdma-core's ibv_reg_mr_ex over a provider without reg_mr_ex (libibverbs' dummy op): a DMA handle
 * is EOPNOTSUPP, a buffer becomes its address range, an fd a dma-buf registration. */
VERSIONED("ibv_reg_mr_ex@@IBVERBS_1.15")
struct ibv_mr *fake_reg_mr_ex(struct ibv_pd *pd, struct fake_mr_init_attr *a)
{
	uint64_t m = a->comp_mask;
	struct ibv_mr *mr;

	count(C_REG_EX);
	if (m & M_BUF) {
		struct fake_buf *b = a->buf;
		uintptr_t base = (uintptr_t)b->addr, at = (uintptr_t)a->addr;

		if (pd != b->pd || !(m & M_ADDR) || at < base || at - base > b->size ||
		    a->length > b->size - (at - base) || (m & (M_FD | M_FD_OFFSET))) {
			errno = EINVAL;
			return NULL;
		}
		m &= ~(uint64_t)M_BUF;
	}
	if (m & ~(uint64_t)(M_IOVA | M_ADDR | M_FD | M_FD_OFFSET)) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	if (m & M_FD) {
		if ((m & M_ADDR) || !(m & M_FD_OFFSET) || !(m & M_IOVA) || a->fd < 0) {
			errno = EINVAL;
			return NULL;
		}
		count(C_DMABUF);
		mr = mr_new(pd, (void *)(uintptr_t)a->fd_offset, a->length, a->iova,
			    (unsigned)a->access);
		if (mr)
			mr->addr = (void *)(uintptr_t)a->fd_offset;
		return mr;
	}
	if (!(m & M_ADDR) || (m & M_FD_OFFSET)) {
		errno = EINVAL;
		return NULL;
	}
	return mr_new(pd, a->addr, a->length, m & M_IOVA ? a->iova : (uintptr_t)a->addr,
		      (unsigned)a->access);
}

/* The port's effective speed in units of 100 Mb/s: 400 Gb/s. */
VERSIONED("ibv_query_port_speed@@IBVERBS_1.16")
int fake_query_port_speed(struct ibv_context *c, uint32_t port, uint64_t *speed)
{
	(void)c;
	if (port != 1)
		return EINVAL;
	*speed = 4000;
	return 0;
}

/* Provider memory: here plain pages. */
VERSIONED("ibv_alloc_buf@@IBVERBS_1.17")
void *fake_alloc_buf(struct ibv_pd *pd, size_t size, struct fake_buf **out)
{
	struct fake_buf *b = calloc(1, sizeof(*b));

	if (!b || posix_memalign(&b->addr, 4096, size ? size : 1)) {
		free(b);
		errno = ENOMEM;
		return NULL;
	}
	b->size = size;
	b->pd = pd;
	*out = b;
	return b->addr;
}

VERSIONED("ibv_free_buf@@IBVERBS_1.17")
void fake_free_buf(struct fake_buf *b)
{
	free(b->addr);
	free(b);
}

/* ibv_reg_mr_ex through the PLT, as rdma-core calls it (renamed: newer headers declare it). */
struct ibv_mr *plt_reg_mr_ex(struct ibv_pd *pd,
			     struct fake_mr_init_attr *a) __asm__("ibv_reg_mr_ex");

VERSIONED("ibv_reg_buf_mr@@IBVERBS_1.17")
struct ibv_mr *fake_reg_buf_mr(struct ibv_pd *pd, struct fake_buf *b, void *addr, size_t len,
			       int access)
{
	struct fake_mr_init_attr a = {
		.length = len,
		.access = access,
		.comp_mask = M_BUF | M_ADDR,
		.addr = addr,
		.buf = b,
	};

	count(C_REG_BUF);
	return plt_reg_mr_ex(pd, &a);
}
#endif

/* ---- IBVERBS_1.0: through the PLT to the 1.1 functions -------------------------------------------- */

VERSIONED("ibv_reg_mr@IBVERBS_1.0")
struct ibv_mr *fake_reg_mr_1_0(struct ibv_pd *pd, void *addr, size_t len, int access)
{
	count(C_REG_1_0);
	return ibv_reg_mr_iova2(pd, addr, len, (uintptr_t)addr, (unsigned)access);
}

VERSIONED("ibv_dereg_mr@IBVERBS_1.0")
int fake_dereg_mr_1_0(struct ibv_mr *mr)
{
	count(C_DEREG_1_0);
	return ibv_dereg_mr(mr);
}

VERSIONED("ibv_dealloc_pd@IBVERBS_1.0")
int fake_dealloc_pd_1_0(struct ibv_pd *pd)
{
	count(C_DEALLOC_PD_1_0);
	return ibv_dealloc_pd(pd);
}

VERSIONED("ibv_close_device@IBVERBS_1.0")
int fake_close_device_1_0(struct ibv_context *c)
{
	count(C_CLOSE_1_0);
	return ibv_close_device(c);
}
