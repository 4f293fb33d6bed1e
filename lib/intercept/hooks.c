/* SPDX-License-Identifier: MIT */
/*
 * Free events from the CUDA driver: the entries of libcuda's exported free and allocation
 * functions (intercept/entries.h, the one list of them) are patched (patch.c) to run the hooks
 * below, and the start-up probe proves it.
 *
 * Why the entry, measured on the H100: the CUDA runtime (static and shared) and
 * PyTorch reach the driver through cuGetProcAddress, never through the exported symbols, and
 * what cuGetProcAddress hands out is the exported function's own address. So code at the entry
 * of libcuda's exported free functions is reached by every route: direct calls, dlsym,
 * cuGetProcAddress (v1 and v2, every flags variant), pointers resolved before libgdrcache was
 * loaded, and whatever way libgdrcache itself was loaded (linked into the executable or into a
 * library it links, dlopen'ed before or after CUDA was initialised, through Python's ctypes,
 * preloaded). The alternatives measured were worse: a dlsym interposer works only where
 * libgdrcache's dlsym is first in the global scope; CUPTI's callbacks see every route but allow
 * one subscriber per process, so the library and a profiler would exclude each other
 * (docs/FACTS.md, "cuGetProcAddress").
 *
 * A free hook, on the calling thread:
 *  1. announces the free in flight (events.h) and publishes the event: caches drop what they
 *     hold of the range before anything else, and no registration can cache the range while
 *     the driver frees it;
 *  2. releases every unreferenced pin of the range in every cache (dma-buf closed, module pin
 *     unpinned, MR deregistered), so the driver's free really returns the memory: an open
 *     dma-buf keeps freed GPU memory allocated (docs/FACTS.md, "dma-buf and freed memory"). A
 *     pin still held by a registration the program has not released goes at its last gdr_dereg;
 *  3. calls the driver, then withdraws the announcement.
 * Step 2 takes each cache's lock. No thread ever waits on the driver while this thread holds
 * something it needs: the hook holds no lock when it calls the driver, and a cache's lock holder
 * only calls driver functions that do not free. It is skipped (left to the lock's holder, or to
 * this thread once the driver returned) where waiting could deadlock: when this thread already
 * holds a cache lock (the library itself called the driver), and in a hook nested in another
 * hook's driver call (the driver calling its own exported function while holding its locks).
 *
 * An allocation hook calls the driver; on CUDA_ERROR_OUT_OF_MEMORY it releases every
 * unreferenced pin of every cache and retries once (in every validation mode). A successful
 * allocation publishes its range (GDR_EV_ALLOC): no cached tag can rightly overlap memory the
 * driver just handed out, which also catches VA reuse after frees the driver makes on its own
 * (stream-ordered frees completing later, graph memory nodes).
 *
 * What it cannot see: a libcuda whose entry bytes the patcher does not fully decode (then the
 * probe fails, says why once at warn, and the caches check tags), frees the driver makes on its
 * own without a later intercepted allocation at that address (graph memory nodes freeing into a
 * pool that is then reused by a graph), process teardown.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/defs.h"
#include "common/config.h"
#include "common/log.h"
#include "cuda/cuda.h"
#include "cuda/cuda_abi.h"
#include "intercept/dmabufs.h"
#include "intercept/events.h"
#include "intercept/hooks.h"
#include "intercept/patch.h"
#include "intercept/stop_world.h"

#define GDR_TLS __thread __attribute__((tls_model("initial-exec")))

/* Hooks this thread is inside (nested: the driver called its own exported entry point). */
static GDR_TLS int hook_depth;
/* This thread is giving back a primary context the library borrowed (gdr_hooks_own_release):
 * 0 no; else the borrow's token (gdr_hooks_borrow_begin), OWN_UNPROVEN where it proves nothing. */
static GDR_TLS uint64_t own_release;
#define OWN_UNPROVEN UINT64_MAX
/* This thread exports a dma-buf for the library's own pin (gdr_hooks_own_export). */
static GDR_TLS int own_export;
/* What each route frees in the probe: no allocation can be there (the driver answers an error, or
 * nothing), and the hook publishes the event before it calls the driver, whatever the driver then
 * says. So the probe needs no allocation and no context: it gives the same answer before the
 * program has made its first context (a cache created at the middleware's initialisation) as after. */
#define PROBE_VA 0
/* Frees of PROBE_VA this thread's hooks saw: the probe's proof (below, "The probe"). Not the ring:
 * other threads' events may lap it between the probe's free and its look. */
static GDR_TLS unsigned probe_frees;

static struct {
	uint64_t frees[GDR_FREE_ROUTES];
	uint64_t released, deferred, oom_relief, oom_retry_ok, free_ns, own_releases;
	uint32_t entries_short, entries_stopped, threads_stopped, threads_moved; /* install time */
	uint64_t stopped_ns;
} hs;

/* Whether the library's release of a primary context it borrowed (cuda.c) can be the last, which
 * frees the context's memory. A look at the context's state after the release proves nothing
 * (another thread may have retained it between the driver's release and the look: issue 31 #1);
 * what proves it is that the application held a reference from before the borrow's retain to
 * after its release. It did if, when the borrow looked at the context's state (active: someone
 * holds a reference), no other borrow held one (so the application did), no application release
 * of a context was running, and none began until the borrow's release returned: the application's
 * references then only grew. Counted over every context and device (a release elsewhere only
 * costs a borrow its proof). The state look and the retain are under borrow_lock, so that no other
 * borrow's retain comes between the count of borrows and the look. */
static pthread_mutex_t borrow_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t own_borrows;                  /* borrows holding a reference of the library's */
static uint64_t app_ctx_begun, app_ctx_ended; /* the application's context hooks: begun, ended */

/* Releases left for later (nested or lock-holding callers): done at the end of the outer hook or
 * by the next gdr_cache_unlock (lib/cache/record.c reads it). */
int gdr_hooks_release_pending;

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- Free hooks ---------------------------------------------------------------------------------- */

/* The event's handlers (events.h: the caches, the public monitors), on this thread now; nested in
 * another hook's driver call, they only note what they must do at the outermost hook's end. */
static void dispatch(uint32_t kind, uint64_t start, uint64_t len)
{
	struct gdr_event e = { .start = start, .len = len, .kind = kind };
	bool deferred;

	__atomic_add_fetch(&hs.released, gdr_events_dispatch(&e, hook_depth != 1, &deferred),
			   __ATOMIC_RELAXED);
	if (deferred)
		__atomic_add_fetch(&hs.deferred, 1, __ATOMIC_RELAXED);
}

struct free_scope {
	int token;      /* gdr_events_free_begin's, where announced */
	bool announced; /* a free in flight announced (a proven release of the library's: none) */
	int cancel;     /* the thread's cancellation state before the hook */
	uint64_t t0;
};

/* A hook is no cancellation point, whatever the driver's free is: a thread cancelled inside it
 * (the pins' release closes dma-bufs; the driver may wait) would leave its free announced for ever
 * (registrations of the range would wait for it) and, in the release, the caches' locks held. A
 * pending cancellation acts at the caller's next cancellation point. */
static void free_begin(struct free_scope *fs, int route, uint64_t start, uint64_t len)
{
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &fs->cancel);
	fs->t0 = now_ns();
	hook_depth++;
	if (start == PROBE_VA && len == 0)
		probe_frees++;
	fs->token = gdr_events_free_begin(start, len);
	fs->announced = true;
	gdr_events_push(start, len);
	gdr_dmabufs_drop(start, len);
	__atomic_add_fetch(&hs.frees[route], 1, __ATOMIC_RELAXED);
	dispatch(GDR_EV_FREE, start, len);
	fs->t0 = now_ns() - fs->t0;
}

static void free_end(struct free_scope *fs)
{
	uint64_t t1 = now_ns();

	if (fs->announced)
		gdr_events_free_end(fs->token);
	if (--hook_depth == 0)
		__atomic_add_fetch(&hs.released, gdr_events_dispatch_end(), __ATOMIC_RELAXED);
	__atomic_add_fetch(&hs.free_ns, fs->t0 + now_ns() - t1, __ATOMIC_RELAXED);
	pthread_setcancelstate(fs->cancel, NULL);
}

typedef gdr_CUresult (*free_fn)(gdr_CUdeviceptr);

/* The hooks come from intercept/entries.h, one a row, made by its kind's macro (FREE_HOOK, CTX_HOOK,
 * ALLOC_HOOK): h_<name> calls its own original, o_<name>, which the patcher fills in. */
#define CALL_ORIG(name, params, args)                                                              \
	((gdr_CUresult(*) params)__atomic_load_n(&o_##name, __ATOMIC_ACQUIRE)) args

#define FREE_HOOK(name, route, params, args, start, len)                                           \
	static void *o_##name;                                                                     \
	static gdr_CUresult h_##name params                                                        \
	{                                                                                          \
		struct free_scope fs;                                                              \
		gdr_CUresult rc;                                                                   \
		int err_ = errno; /* before the call, and as the driver left it after */           \
                                                                                                   \
		free_begin(&fs, route, start, len);                                                \
		errno = err_;                                                                      \
		rc = CALL_ORIG(name, params, args);                                                \
		err_ = errno;                                                                      \
		free_end(&fs);                                                                     \
		errno = err_;                                                                      \
		return rc;                                                                         \
	}

#define ALL GDR_EVENT_ALL_LEN

/* Context destroys, resets and primary-context releases. They free a context's memory, not all GPU
 * memory (another device's, pool and VMM memory survive: docs/FACTS.md, "Several GPUs"), and a
 * primary-context release that is not the last frees nothing. So nothing is dropped before the
 * call: registrations wait while it runs (a free of everything in flight), and after it every
 * cached entry's allocations are asked of the driver again (GDR_EV_CTX), which drops exactly the
 * entries whose memory went, before the hook returns. A context still active after the release
 * does not prove that it was not the last: another thread may have retained it between the
 * driver's release (which freed its memory) and the hook's look, making a new one. So every
 * application's release asks again; only the library's own release of a context it borrowed for a
 * call (cuda.c, one per dma-buf export from a thread without the device's context: asking every
 * entry again there would cost each such miss the whole cache) publishes nothing while the context
 * stays active. */
/* Whether the library's own release on this thread is proven not the last so far: its borrow had
 * a proof and no application context hook began since (see borrow_lock). */
static bool own_proven(void)
{
	return own_release && own_release != OWN_UNPROVEN &&
	       __atomic_load_n(&app_ctx_begun, __ATOMIC_SEQ_CST) == own_release - 1;
}

/* A release proven not the last frees nothing: it announces nothing (registrations would wait for
 * a free that never comes, issue 31 #2) and is no application free. Any other release of the
 * library's own is handled as the application's, and counted apart (own_releases). */
static void ctx_begin(struct free_scope *fs, int route)
{
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &fs->cancel); /* as free_begin */
	fs->t0 = now_ns();
	hook_depth++;
	fs->announced = false;
	if (!own_release)
		__atomic_add_fetch(&app_ctx_begun, 1, __ATOMIC_SEQ_CST);
	if (!own_proven()) {
		fs->token = gdr_events_free_begin(0, ALL);
		fs->announced = true;
		gdr_dmabufs_drop(0, ALL); /* no dma-buf is vouched for while a context may go */
		__atomic_add_fetch(own_release ? &hs.own_releases : &hs.frees[route], 1,
				   __ATOMIC_RELAXED);
	}
	fs->t0 = now_ns() - fs->t0; /* the hook's own time, as free_begin counts it */
}

static void ctx_end(struct free_scope *fs)
{
	uint64_t t1 = now_ns();

	/* Checked again after the call: an application release that began during it may have left
	 * this one the last. Its memory is then asked of the driver again now, before the release
	 * returns; a registration that classified it meanwhile holds the cache's lock until its
	 * entry is made, which the event then drops (or finds on its next hit). */
	if (!own_proven()) {
		if (!fs->announced) { /* proven at the start only */
			gdr_dmabufs_drop(0, ALL);
			__atomic_add_fetch(&hs.own_releases, 1, __ATOMIC_RELAXED);
		}
		gdr_cuda_contexts_changed();
		gdr_events_push_kind(GDR_EV_CTX, 0, ALL);
		dispatch(GDR_EV_CTX, 0, ALL);
	}
	if (!own_release)
		__atomic_add_fetch(&app_ctx_ended, 1, __ATOMIC_SEQ_CST);
	fs->t0 += now_ns() - t1;
	free_end(fs);
}

#define CTX_HOOK(name, route, params, args, release, dev)                                          \
	static void *o_##name;                                                                     \
	static gdr_CUresult h_##name params                                                        \
	{                                                                                          \
		struct free_scope fs;                                                              \
		gdr_CUresult rc;                                                                   \
		int err_ = errno; /* before the call, and as the driver left it after */           \
                                                                                                   \
		ctx_begin(&fs, route);                                                             \
		errno = err_;                                                                      \
		rc = CALL_ORIG(name, params, args);                                                \
		err_ = errno;                                                                      \
		ctx_end(&fs);                                                                      \
		errno = err_;                                                                      \
		return rc;                                                                         \
	}

uint64_t gdr_hooks_borrow_begin(void)
{
	uint64_t n, begun;

	pthread_mutex_lock(&borrow_lock);
	n = __atomic_fetch_add(&own_borrows, 1, __ATOMIC_SEQ_CST);
	begun = __atomic_load_n(&app_ctx_begun, __ATOMIC_SEQ_CST);
	if (n || __atomic_load_n(&app_ctx_ended, __ATOMIC_SEQ_CST) != begun)
		return OWN_UNPROVEN;
	return begun + 1;
}

void gdr_hooks_borrow_looked(bool retained)
{
	if (!retained)
		__atomic_sub_fetch(&own_borrows, 1, __ATOMIC_SEQ_CST);
	pthread_mutex_unlock(&borrow_lock);
}

void gdr_hooks_own_release(uint64_t token)
{
	if (!token) /* the release returned: the borrow holds nothing from here on */
		__atomic_sub_fetch(&own_borrows, 1, __ATOMIC_SEQ_CST);
	own_release = token;
}

/* ---- Allocation hooks --------------------------------------------------------------------------- */

/* An allocation failed for lack of memory: release unreferenced pins; whether to retry. */
static bool oom_relieve(void)
{
	if (hook_depth != 1)
		return false;
	__atomic_add_fetch(&hs.oom_relief, 1, __ATOMIC_RELAXED);
	return gdr_events_dispatch_relieve() > 0;
}

/* Calls the original; on OUT_OF_MEMORY relieves and calls it once more; on success publishes the
 * range [va, va + size) (size 0: none, e.g. cuMemCreate's handle). An allocation has no route. */
#define ALLOC_HOOK(name, no_route, params, args, va, size)                                         \
	static void *o_##name;                                                                     \
	static gdr_CUresult h_##name params                                                        \
	{                                                                                          \
		gdr_CUresult rc;                                                                   \
                                                                                                   \
		hook_depth++;                                                                      \
		rc = CALL_ORIG(name, params, args);                                                \
		if (rc == GDR_CUDA_ERROR_OUT_OF_MEMORY && oom_relieve()) {                         \
			rc = CALL_ORIG(name, params, args);                                        \
			if (rc == GDR_CUDA_SUCCESS)                                                \
				__atomic_add_fetch(&hs.oom_retry_ok, 1, __ATOMIC_RELAXED);         \
		}                                                                                  \
		if (rc == GDR_CUDA_SUCCESS && (size) != 0) {                                       \
			gdr_events_push_kind(GDR_EV_ALLOC, (uint64_t)(uintptr_t)(va), size);       \
			gdr_dmabufs_drop((uint64_t)(uintptr_t)(va), size);                         \
			dispatch(GDR_EV_ALLOC, (uint64_t)(uintptr_t)(va), size);                   \
		}                                                                                  \
		if (--hook_depth == 0)                                                             \
			__atomic_add_fetch(&hs.released, gdr_events_dispatch_end(),                \
					   __ATOMIC_RELAXED);                                      \
		return rc;                                                                         \
	}

/* ---- Export hooks --------------------------------------------------------------------------------- */

void gdr_hooks_own_export(bool on)
{
	own_export = on;
}

/* The handle and type of an EXPORT row's call (its first and fourth parameters). */
#define EXPORT_HANDLE_(h, ...) (h)
#define EXPORT_TYPE_(h, p, n, type, ...) (type)

/* Calls the original; a dma-buf it exported for the program (not for the library's own pin) is
 * recorded with its range (dmabufs.c), provided the allocation at the range's start is the same
 * before and after the call. */
#define EXPORT_HOOK(name, no_route, params, args, va, size)                                        \
	static void *o_##name;                                                                     \
	static gdr_CUresult h_##name params                                                        \
	{                                                                                          \
		bool dmabuf_ = EXPORT_HANDLE_ args &&                                              \
			       EXPORT_TYPE_ args == GDR_CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD &&     \
			       !own_export;                                                        \
		uint64_t id0_ = 0;                                                                 \
		gdr_CUresult rc;                                                                   \
		int err_;                                                                          \
                                                                                                   \
		hook_depth++;                                                                      \
		if (dmabuf_ && gdr_cuda_buffer_id((uint64_t)(va), &id0_))                          \
			id0_ = 0;                                                                  \
		rc = CALL_ORIG(name, params, args);                                                \
		err_ = errno;                                                                      \
		if (rc == GDR_CUDA_SUCCESS && dmabuf_ && id0_)                                     \
			gdr_dmabufs_exported(*(int *)EXPORT_HANDLE_ args, (uint64_t)(va),          \
					     (uint64_t)(size), id0_);                              \
		hook_depth--;                                                                      \
		errno = err_;                                                                      \
		return rc;                                                                         \
	}

/* ---- The hooks and the table --------------------------------------------------------------------
 * Every entry point libcuda exports that frees or allocates device memory (intercept/entries.h):
 * its hook, and its patch target. `required`: events are sure only if it is patched wherever
 * libcuda has it (an allocation hook is relief and a belt to the free events' braces: its absence
 * costs no correctness). */
#define GDR_ENTRY(name, kind, route, fake, params, args, a, b)                                     \
	kind##_HOOK(name, route, params, args, a, b)
#include "intercept/entries.h"

/* Each route of enum gdr_free_route counts the calls of at least one entry point, and every free
 * entry point's route is one of them. */
#define ROUTE_BIT_FREE(route) | 1u << (route)
#define ROUTE_BIT_CTX(route) | 1u << (route)
#define ROUTE_BIT_ALLOC(no_route)
#define ROUTE_BIT_EXPORT(no_route)
#define GDR_ENTRY(name, kind, route, ...) ROUTE_BIT_##kind(route)
_Static_assert(
	(0u
#include "intercept/entries.h"
	 ) == (1u << GDR_FREE_ROUTES) - 1,
	"intercept/entries.h: a route without an entry point, or an entry point outside them");

struct target {
	const char *name;
	void *hook;
	void **orig;
	bool required;
	int state; /* 0 patched; -ENOENT not in this libcuda; other -errno: refused */
	const char *why;
};

#define REQUIRED_FREE true
#define REQUIRED_CTX true
#define REQUIRED_ALLOC false
#define REQUIRED_EXPORT false
static struct target targets[] = {
#define GDR_ENTRY(name, kind, ...)                                                                 \
	{ #name, (void *)h_##name, &o_##name, REQUIRED_##kind, -ENOENT, NULL },
#include "intercept/entries.h"
};
#define NTARGETS (sizeof(targets) / sizeof(targets[0]))

static int install_rc = -ENODEV;
static char install_why[116] = "no CUDA driver";

/* The mode: asked by a cache's attribute (-1: none), decided at the install (GDRCACHE_INTERCEPT
 * where none was asked). Under mode_lock. */
static pthread_mutex_t mode_lock = PTHREAD_MUTEX_INITIALIZER;
static int mode_asked = -1, mode_decided = -1;

int gdr_hooks_ask(int mode)
{
	int rc = 0;

	pthread_mutex_lock(&mode_lock);
	if (mode_decided >= 0)
		rc = mode == mode_decided ? 0 : -EALREADY;
	else
		mode_asked = mode;
	pthread_mutex_unlock(&mode_lock);
	return rc;
}

int gdr_hooks_mode(void)
{
	int m;

	pthread_mutex_lock(&mode_lock);
	m = mode_decided;
	pthread_mutex_unlock(&mode_lock);
	return m;
}

static int decide_mode(const char **by)
{
	int m;

	pthread_mutex_lock(&mode_lock);
	*by = mode_asked >= 0 ? "a cache's attribute" : "GDRCACHE_INTERCEPT";
	m = mode_decided = mode_asked >= 0 ? mode_asked : gdr_config_get()->intercept;
	pthread_mutex_unlock(&mode_lock);
	return m;
}

/* GDRCACHE_INTERCEPT=yield: whether another tool patched one of libcuda's entries (UCX's bistro
 * writes a jump there). Then nothing is patched, and why says whose. */
static bool foreign_patch(void *libcuda)
{
	for (size_t i = 0; i < NTARGETS; i++) {
		void *fn = dlsym(libcuda, targets[i].name);
		const char *who;

		if (fn && gdr_patch_foreign(fn, &who) == 1) {
			install_rc = -EBUSY;
			snprintf(install_why, sizeof(install_why), "yield: %s already patched (%s)",
				 targets[i].name, who);
			return true;
		}
	}
	return false;
}

void gdr_hooks_install(void *libcuda, bool fresh)
{
	int nreq = 0, nok = 0, nalloc_fail = 0, nshort = 0, nstopped = 0;
	const char *first_alloc_fail = NULL, *alloc_why = NULL, *by;
	int mode = decide_mode(&by);

	if (mode == GDR_INTERCEPT_OFF) {
		install_rc = -EOPNOTSUPP;
		snprintf(install_why, sizeof(install_why), "interception turned off by %s", by);
		gdr_info("CUDA free interception off (%s): no free events, hits are validated by "
			 "BUFFER_ID queries, no out-of-memory relief",
			 install_why);
		return;
	}
	if (mode == GDR_INTERCEPT_YIELD && foreign_patch(libcuda)) {
		gdr_warn("CUDA free interception left to another tool (GDRCACHE_INTERCEPT=%s): no "
			 "free events, hits are validated by BUFFER_ID queries, no out-of-memory "
			 "relief",
			 install_why);
		return;
	}
	install_rc = 0;
	snprintf(install_why, sizeof(install_why), "free interception installed");
	for (size_t i = 0; i < NTARGETS; i++) {
		struct target *t = &targets[i];
		void *fn = dlsym(libcuda, t->name);

		if (!fn)
			continue; /* this libcuda does not have it */
		t->state = gdr_patch_install(fn, t->hook, t->orig, fresh ? GDR_PATCH_QUIESCENT : 0,
					     &t->why);
		nshort += !t->state && gdr_patch_bytes(fn) == 1;
		if (!t->state && gdr_patch_stopped(fn)) {
			struct gdr_stw_stats st = gdr_stw_last();

			nstopped++;
			hs.threads_stopped += st.threads;
			hs.threads_moved += st.relocated;
			hs.stopped_ns += st.ns;
		}
		if (t->required) {
			nreq++;
			if (!t->state) {
				nok++;
			} else if (!install_rc) {
				install_rc = t->state;
				snprintf(install_why, sizeof(install_why), "%s: %s", t->name,
					 t->why);
			}
		} else if (t->state) {
			nalloc_fail++;
			if (!first_alloc_fail)
				first_alloc_fail = t->name, alloc_why = t->why;
		}
	}
	if (!nreq && !install_rc) {
		install_rc = -ENOSYS;
		snprintf(install_why, sizeof(install_why), "libcuda exports no free function");
	}
	if (nalloc_fail)
		gdr_warn("%d CUDA allocation or export entry points not intercepted (%s: %s): no "
			 "out-of-memory relief or dma-buf caching through them",
			 nalloc_fail, first_alloc_fail, alloc_why);
	__atomic_store_n(&hs.entries_short, (uint32_t)nshort, __ATOMIC_RELAXED);
	__atomic_store_n(&hs.entries_stopped, (uint32_t)nstopped, __ATOMIC_RELAXED);
	gdr_info("CUDA free interception: %d of %d free entry points patched, %d entries in the "
		 "one-byte form, %d with the other threads stopped%s",
		 nok, nreq, nshort, nstopped,
		 fresh ? " (libcuda loaded by libgdrcache: no thread was inside it)" : "");
}

/* The interception as the driver loader's watch (cuda/cuda.h): the loader calls these and never
 * names this layer. */
static const struct gdr_cuda_watch hooks_watch = {
	.loaded = gdr_hooks_install,
	.borrow_begin = gdr_hooks_borrow_begin,
	.borrow_looked = gdr_hooks_borrow_looked,
	.own_release = gdr_hooks_own_release,
	.own_export = gdr_hooks_own_export,
};

int gdr_driver_load(void)
{
	return gdr_cuda_load(&hooks_watch);
}

/* ---- The probe -----------------------------------------------------------------------------------
 * Proves, in the running process, that every route to every free entry point lands in a hook:
 * each required entry point libcuda has was patched; cuGetProcAddress, asked what the CUDA runtime
 * asks (base names, the versions and flags it uses), hands out patched entries; and a test
 * free of an address no allocation holds (PROBE_VA), made through cuGetProcAddress's pointer,
 * through dlsym(libcuda) and through the global scope's binding, is seen each time. */

/* One route: whether fr's free of PROBE_VA reached a hook on this thread. */
static int probe_path(free_fn fr, const char **why, const char *fail)
{
	unsigned before = probe_frees;

	(void)fr(PROBE_VA); /* an error from the driver is expected: only the hook matters */
	if (probe_frees == before) {
		*why = fail;
		return -ENOSYS;
	}
	return 0;
}

/* What the CUDA runtime and PyTorch ask cuGetProcAddress for (docs/FACTS.md, "cuGetProcAddress";
 * fake_cuda.c). */
static const struct {
	const char *sym;
	int version;
	uint64_t flags;
} gpa_asks[] = {
	{ "cuMemFree", 3020, 0 },
	{ "cuMemFreeAsync", 11020, 0 },
	{ "cuMemFreeAsync", 11020, 2 },
	{ "cuMemFreeHost", 2000, 0 },
	{ "cuMemUnmap", 10020, 0 },
	{ "cuIpcCloseMemHandle", 4010, 0 },
	{ "cuCtxDestroy", 4000, 0 },
	{ "cuDevicePrimaryCtxRelease", 11000, 0 },
	{ "cuDevicePrimaryCtxReset", 11000, 0 },
	{ "cuDevicePrimaryCtxRelease", 7000, 0 },
	{ "cuMemFree", 12000, 0 },
	{ "cuMemFreeAsync", 12000, 0 },
};

static int probe_rc = -ENODEV;
static char probe_why[116] = "no CUDA driver";

static void __attribute__((format(printf, 2, 3))) probe_fail(int rc, const char *fmt, ...)
{
	va_list ap;

	probe_rc = rc;
	va_start(ap, fmt);
	vsnprintf(probe_why, sizeof(probe_why), fmt, ap);
	va_end(ap);
}

static void probe_once(void)
{
	gdr_cuGetProcAddress_v2_t gpa2;
	gdr_cuGetProcAddress_v1_t gpa1;
	const char *why = NULL;
	void *h, *fr = NULL, *fr2;
	int rc, st = 0;

	if (gdr_driver_load() || !(h = gdr_cuda_libcuda_handle()))
		return; /* "no CUDA driver" */
	if (install_rc) {
		probe_fail(install_rc, "%s", install_why);
		return;
	}
	gpa2 = (gdr_cuGetProcAddress_v2_t)dlsym(h, "cuGetProcAddress_v2");
	gpa1 = (gdr_cuGetProcAddress_v1_t)dlsym(h, "cuGetProcAddress");
	for (size_t i = 0; i < sizeof(gpa_asks) / sizeof(gpa_asks[0]); i++) {
		void *f1 = NULL, *f2 = NULL;

		if (gpa2)
			gpa2(gpa_asks[i].sym, &f2, gpa_asks[i].version, gpa_asks[i].flags, &st);
		if (gpa1 && gpa_asks[i].version < 12000)
			gpa1(gpa_asks[i].sym, &f1, gpa_asks[i].version, gpa_asks[i].flags);
		if ((f2 && !gdr_patch_is_patched(f2)) || (f1 && !gdr_patch_is_patched(f1))) {
			probe_fail(-ENOSYS,
				   "cuGetProcAddress(\"%s\") hands out a function that is "
				   "not libcuda's exported entry",
				   gpa_asks[i].sym);
			return;
		}
	}
	if (gpa2)
		gpa2("cuMemFree", &fr, 3020, 0, &st);
	else if (gpa1)
		gpa1("cuMemFree", &fr, 3020, 0);
	if (!fr) {
		probe_fail(-ENOSYS, "%s", "cuGetProcAddress lacks cuMemFree");
		return;
	}
	/* (a) the CUDA runtime's and PyTorch's route */
	rc = probe_path((free_fn)fr, &why, "a free through cuGetProcAddress was not seen");
	/* (b) dlsym(libcuda handle, "cuMemFree_v2") */
	fr2 = rc ? NULL : dlsym(h, "cuMemFree_v2");
	if (fr2)
		rc = probe_path((free_fn)fr2, &why,
				"a free through dlsym(libcuda, \"cuMemFree_v2\") was not seen");
	/* (c) a direct call from a program linked with -lcuda: what the global scope binds */
	fr2 = rc ? NULL : dlsym(RTLD_DEFAULT, "cuMemFree_v2");
	if (fr2)
		rc = probe_path(
			(free_fn)fr2, &why,
			"a free through dlsym(RTLD_DEFAULT, \"cuMemFree_v2\") was not seen");
	if (rc)
		probe_fail(rc, "%s", why);
	else
		probe_fail(0, "%s", "every route to the driver's free functions is intercepted");
}

int gdr_events_probe(const char **why)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, probe_once);
	if (why)
		*why = probe_why;
	return probe_rc;
}

/* ---- Statistics ---------------------------------------------------------------------------------- */

void gdr_hooks_get_stats(struct gdr_intercept_stats *out)
{
	struct gdr_intercept_stats s;
	const char *why;
	int saved_errno = errno; /* dlopen, the probe's reads of /proc and mprotect */

	memset(&s, 0, sizeof(s));
	s.state = gdr_driver_load() ? -ENODEV : gdr_events_probe(&why);
	snprintf(s.reason, sizeof(s.reason), "%s", s.state == -ENODEV ? "no CUDA driver" : why);
	for (int i = 0; i < GDR_FREE_ROUTES; i++)
		s.frees[i] = __atomic_load_n(&hs.frees[i], __ATOMIC_RELAXED);
	s.released = __atomic_load_n(&hs.released, __ATOMIC_RELAXED);
	s.deferred = __atomic_load_n(&hs.deferred, __ATOMIC_RELAXED);
	s.oom_relief = __atomic_load_n(&hs.oom_relief, __ATOMIC_RELAXED);
	s.oom_retry_ok = __atomic_load_n(&hs.oom_retry_ok, __ATOMIC_RELAXED);
	s.free_ns = __atomic_load_n(&hs.free_ns, __ATOMIC_RELAXED);
	s.own_releases = __atomic_load_n(&hs.own_releases, __ATOMIC_RELAXED);
	s.entries_short = __atomic_load_n(&hs.entries_short, __ATOMIC_RELAXED);
	s.entries_stopped = __atomic_load_n(&hs.entries_stopped, __ATOMIC_RELAXED);
	s.threads_stopped = __atomic_load_n(&hs.threads_stopped, __ATOMIC_RELAXED);
	s.threads_moved = __atomic_load_n(&hs.threads_moved, __ATOMIC_RELAXED);
	s.stopped_ns = __atomic_load_n(&hs.stopped_ns, __ATOMIC_RELAXED);
	*out = s;
	errno = saved_errno;
}

/* One line for GDRCACHE_STATS and logs. */
void gdr_hooks_stats_line(char *buf, size_t n)
{
	static const char *const names[GDR_FREE_ROUTES] = {
		[GDR_FREE_MEM_FREE] = "cuMemFree",
		[GDR_FREE_MEM_FREE_ASYNC] = "cuMemFreeAsync",
		[GDR_FREE_MEM_FREE_HOST] = "cuMemFreeHost",
		[GDR_FREE_MEM_UNMAP] = "cuMemUnmap",
		[GDR_FREE_IPC_CLOSE] = "cuIpcCloseMemHandle",
		[GDR_FREE_CTX] = "context",
	};
	size_t off = 0;

	off += (size_t)snprintf(buf + off, n - off, "frees seen:");
	for (int i = 0; i < GDR_FREE_ROUTES && off < n; i++)
		off += (size_t)snprintf(buf + off, n - off, " %s %llu", names[i],
					(unsigned long long)__atomic_load_n(&hs.frees[i],
									    __ATOMIC_RELAXED));
	if (off < n)
		snprintf(
			buf + off, n - off,
			"; pins released in frees %llu, deferred %llu; "
			"out-of-memory reliefs %llu (%llu retries succeeded); %llu ns in free hooks",
			(unsigned long long)__atomic_load_n(&hs.released, __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&hs.deferred, __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&hs.oom_relief, __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&hs.oom_retry_ok, __ATOMIC_RELAXED),
			(unsigned long long)__atomic_load_n(&hs.free_ns, __ATOMIC_RELAXED));
}
