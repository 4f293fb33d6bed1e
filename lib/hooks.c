/* SPDX-License-Identifier: MIT */
/*
 * Free events from the CUDA driver: wrappers of its free entry points, handed out where programs
 * resolve them, and the start-up proof that they are in place (gdr_events_probe).
 *
 * How programs reach the driver (measured on the H100, FACTS.md): the CUDA runtime, static and
 * shared, calls dlsym(libcuda handle, "cuGetProcAddress_v2") once and takes every entry point from
 * it ("cuMemFree" at 3020, "cuMemFreeAsync" with flags 0 and PER_THREAD_DEFAULT_STREAM, ...);
 * PyTorch does the same and also dlsyms a few functions (cuDevicePrimaryCtxRelease, ...) directly.
 * None of them calls an exported symbol. So the interception sits in dlsym:
 *
 *  - libgdrcache.so exports dlsym and dlvsym under glibc's version nodes (dlsym@@GLIBC_2.34 and the
 *    compat dlsym@GLIBC_2.2.5, as libc.so.6 has them on x86-64: a versioned reference binds only to
 *    a definition of the same node). hooks_export.c holds them: a few instructions that save the
 *    arguments, ask gdr_hooks_dlsym_route() where to go, and JUMP there, so that the next dlsym
 *    sees the caller's return address (RTLD_NEXT, and RTLD_DEFAULT's namespace, depend on it).
 *  - For the names below, the route is a hooked lookup: it asks the real dlsym, then hands back a
 *    wrapper. cuGetProcAddress(_v2) becomes a wrapper that does the same to everything it returns,
 *    itself included (v1 ABI below cudaVersion 12000, v2 from there; each flags variant, the
 *    per-thread-stream _ptsz functions too, gets its own wrapper). Any other name, or the handle
 *    RTLD_NEXT, goes straight to the real dlsym (RTLD_NEXT lookups of driver names are not wrapped).
 *  - A wrapper publishes the range with gdr_events_push() BEFORE it calls the driver: one atomic
 *    load of the real function, one fetch-add and four stores; no lock, no allocation, no logging.
 *    Ranges: cuMemFree(_v2), cuMemFreeAsync(_ptsz), cuMemFreeHost, cuIpcCloseMemHandle: the
 *    allocation at the pointer (len 0); cuMemUnmap: [ptr, ptr+size); cuCtxDestroy(_v2),
 *    cuDevicePrimaryCtxReset(_v2), cuDevicePrimaryCtxRelease(_v2): everything (GDR_EVENT_ALL_LEN;
 *    a release only destroys the context on the last reference, but which one is last is not
 *    known here, so every release counts: correct, and rare in practice). cuMemRelease is not
 *    wrapped: it frees physical memory only once no mapping of it is left, and the mapping's
 *    cuMemUnmap is the event for the VA; a handle has no address anyway.
 *  - Wrappers are fixed functions, GDR_HOOK_SLOTS per kind of entry point, each bound once (by a
 *    compare-and-swap) to one real function pointer: nothing is allocated, and a pointer seen
 *    again gets the same wrapper. Were the slots ever exhausted, the real function is handed out
 *    unwrapped and the probe reports it.
 *  - hooks_export.c also exports forwarders under the driver's names (cuMemFree_v2, ...), for a
 *    program linked with -lgdrcache ahead of -lcuda that calls them directly, and
 *    gdr_private_dlsym / gdr_private_dlvsym: the same trampolines, for libgdrcache-preload.so,
 *    whose own dlsym tail-calls them (there libgdrcache.so comes after libc in the lookup order).
 *
 * When it works: the program's dlsym must resolve to ours, i.e. libgdrcache.so (or the preload
 * library) must come before libc.so.6 in the global lookup order: linked into the executable
 * (-lgdrcache), or LD_PRELOADed. A libgdrcache.so that arrives by dlopen (a Python extension, a
 * plugin) comes after libc: dlsym is libc's, nothing is wrapped, and gdr_events_probe() says so;
 * the caches then check tags. The probe proves it in the running process: a fresh 2 MiB allocation
 * (no cache can hold it) freed through cuGetProcAddress as obtained by dlsym(libcuda handle,
 * "cuGetProcAddress_v2") (the runtime's path), through dlsym(handle, "cuMemFree_v2") (PyTorch's
 * kind of lookup) and through what the dynamic linker binds a direct call of cuMemFree_v2 to (the
 * real dlsym(RTLD_DEFAULT): libgdrcache's forwarder, or libcuda's own when libcuda comes first in
 * the global scope, e.g. a program linked -lcuda ahead of -lgdrcache or under the preload library)
 * must each be seen in the event ring.
 *
 * What it cannot see: frees through pointers resolved before libgdrcache was loaded, or by a dlsym
 * that is not the global one (a static binary, a libcuda linked statically, dlmopen namespaces,
 * another interposer that bypasses RTLD_NEXT); memory freed by the driver on its own: CUDA graph
 * memory nodes (cuGraphAddMemFreeNode, cudaFreeAsync captured in a graph), a stream-ordered pool
 * trimmed (the VA was already announced at cuMemFreeAsync), process teardown. Only x86-64 has the
 * dlsym trampolines; elsewhere the probe fails and tags are checked.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <link.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "events.h"
#include "gdrcache_int.h"
#include "hooks.h"

/* ---- The real dlsym / dlvsym ------------------------------------------------------------------ */

/* The dlsym route runs inside sanitizer runtimes' own start-up (ASan and TSan find the functions
 * they intercept with dlsym(RTLD_NEXT, ...), which is ours), before their shadow memory exists:
 * nothing on it may be instrumented. */
#define GDR_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static dlsym_fn real_dlsym, libc_dlsym;
static dlvsym_fn real_dlvsym;

/* No libc string functions on this path: it runs before sanitizer runtimes are initialised (ASan
 * finds its own interceptees with dlsym, which is ours when libgdrcache is linked). */
static GDR_NO_SANITIZE bool streq(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

static GDR_NO_SANITIZE bool is_libc(const char *path)
{
	const char *base = path;

	for (const char *p = path; *p; p++)
		if (*p == '/')
			base = p + 1;
	return streq(base, "libc.so.6");
}

/* The default-version definition of name in a loaded object, from its GNU hash table. */
static GDR_NO_SANITIZE void *elf_lookup(const struct link_map *l, const char *name)
{
	const ElfW(Sym) *symtab = NULL;
	const ElfW(Half) *versym = NULL;
	const uint32_t *gnu = NULL;
	const char *strtab = NULL;
	uint32_t h = 5381;

	for (const ElfW(Dyn) *d = l->l_ld; d->d_tag != DT_NULL; d++) {
		/* glibc relocates these in place where the dynamic section is writable */
		uintptr_t p = d->d_un.d_ptr < l->l_addr ? d->d_un.d_ptr + l->l_addr : d->d_un.d_ptr;

		switch (d->d_tag) {
		case DT_SYMTAB: symtab = (const void *)p; break;
		case DT_STRTAB: strtab = (const void *)p; break;
		case DT_GNU_HASH: gnu = (const void *)p; break;
		case DT_VERSYM: versym = (const void *)p; break;
		}
	}
	if (!symtab || !strtab || !gnu)
		return NULL;
	for (const unsigned char *c = (const unsigned char *)name; *c; c++)
		h = h * 33 + *c;

	uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
	const ElfW(Addr) *bloom = (const void *)&gnu[4];
	const uint32_t *buckets = (const void *)&bloom[bloom_size];
	const uint32_t *chain = &buckets[nbuckets];

	for (uint32_t i = buckets[h % nbuckets]; i >= symoffset; i++) {
		uint32_t ch = chain[i - symoffset];

		if ((ch | 1) == (h | 1) && symtab[i].st_shndx != SHN_UNDEF &&
		    streq(strtab + symtab[i].st_name, name) && (!versym || !(versym[i] & 0x8000)))
			return (void *)(l->l_addr + symtab[i].st_value);
		if (ch & 1)
			break;
	}
	return NULL;
}

/* Finds libc's dlvsym and dlsym by reading its symbol table (we define both names ourselves), then
 * asks for the next dlsym / dlvsym after libgdrcache (another interposer's, usually libc's: the
 * call below comes from this library, so RTLD_NEXT means "after libgdrcache"). Idempotent: threads
 * racing here store the same values. */
static GDR_NO_SANITIZE void hooks_init(void)
{
	dlvsym_fn lv = NULL, nv;
	dlsym_fn ls = NULL, ns;

	if (__atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE))
		return;
	for (const struct link_map *l = _r_debug.r_map; l; l = l->l_next) {
		if (l->l_name && is_libc(l->l_name)) {
			lv = (dlvsym_fn)elf_lookup(l, "dlvsym");
			ls = (dlsym_fn)elf_lookup(l, "dlsym");
			break;
		}
	}
	if (!lv || !ls)
		return; /* not glibc: the routes fail every lookup (see below) */
	nv = (dlvsym_fn)lv(RTLD_NEXT, "dlvsym", "GLIBC_2.34");
	if (!nv)
		nv = (dlvsym_fn)lv(RTLD_NEXT, "dlvsym", "GLIBC_2.2.5");
	ns = (dlsym_fn)lv(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!ns)
		ns = (dlsym_fn)lv(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	__atomic_store_n(&libc_dlsym, ls, __ATOMIC_RELEASE);
	__atomic_store_n(&real_dlvsym, nv ? nv : lv, __ATOMIC_RELEASE);
	__atomic_store_n(&real_dlsym, ns ? ns : ls, __ATOMIC_RELEASE);
}

static void *no_dlsym(void *h, const char *name)
{
	(void)h, (void)name;
	return NULL;
}

void *gdr_hooks_real_dlsym(void *h, const char *name)
{
	hooks_init();
	dlsym_fn f = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);

	return f ? f(h, name) : NULL;
}

/* ---- Wrappers ---------------------------------------------------------------------------------- */

enum hook_kind {
	K_FREE,       /* CUresult f(CUdeviceptr): cuMemFree_v2, cuIpcCloseMemHandle */
	K_FREE32,     /* CUresult f(unsigned int): cuMemFree of CUDA < 3.2 */
	K_FREE_ASYNC, /* CUresult f(CUdeviceptr, CUstream): cuMemFreeAsync(_ptsz) */
	K_FREE_HOST,  /* CUresult f(void *): cuMemFreeHost */
	K_UNMAP,      /* CUresult f(CUdeviceptr, size_t): cuMemUnmap */
	K_CTX,        /* CUresult f(CUcontext): cuCtxDestroy(_v2) */
	K_DEV,        /* CUresult f(CUdevice): cuDevicePrimaryCtxReset / Release (_v2) */
	K_GPA1,       /* cuGetProcAddress, CUDA 11.3 ABI */
	K_GPA2,       /* cuGetProcAddress_v2, CUDA 12.0 ABI (CUdriverProcAddressQueryResult *) */
	K_COUNT,
	K_NONE = -1,
};

#define GDR_HOOK_SLOTS 4

typedef gdr_CUresult (*free_fn)(gdr_CUdeviceptr);
typedef gdr_CUresult (*free32_fn)(unsigned int);
typedef gdr_CUresult (*free_async_fn)(gdr_CUdeviceptr, void *);
typedef gdr_CUresult (*free_host_fn)(void *);
typedef gdr_CUresult (*unmap_fn)(gdr_CUdeviceptr, size_t);
typedef gdr_CUresult (*ctx_fn)(gdr_CUcontext);
typedef gdr_CUresult (*dev_fn)(gdr_CUdevice);

static void *slot_real[K_COUNT][GDR_HOOK_SLOTS];
static int slots_exhausted;

#define REAL(k, i) __atomic_load_n(&slot_real[k][i], __ATOMIC_ACQUIRE)

static void *wrap(enum hook_kind k, void *real);
static enum hook_kind gpa_kind(const char *sym, int version);

#define DEFINE_SLOT(i)                                                                             \
	static gdr_CUresult w_free_##i(gdr_CUdeviceptr p)                                          \
	{                                                                                          \
		gdr_events_push(p, 0);                                                             \
		return ((free_fn)REAL(K_FREE, i))(p);                                              \
	}                                                                                          \
	static gdr_CUresult w_free32_##i(unsigned int p)                                           \
	{                                                                                          \
		gdr_events_push(p, 0);                                                             \
		return ((free32_fn)REAL(K_FREE32, i))(p);                                          \
	}                                                                                          \
	static gdr_CUresult w_free_async_##i(gdr_CUdeviceptr p, void *stream)                      \
	{                                                                                          \
		gdr_events_push(p, 0);                                                             \
		return ((free_async_fn)REAL(K_FREE_ASYNC, i))(p, stream);                          \
	}                                                                                          \
	static gdr_CUresult w_free_host_##i(void *p)                                               \
	{                                                                                          \
		gdr_events_push((uintptr_t)p, 0);                                                  \
		return ((free_host_fn)REAL(K_FREE_HOST, i))(p);                                    \
	}                                                                                          \
	static gdr_CUresult w_unmap_##i(gdr_CUdeviceptr p, size_t size)                            \
	{                                                                                          \
		gdr_events_push(p, size);                                                          \
		return ((unmap_fn)REAL(K_UNMAP, i))(p, size);                                      \
	}                                                                                          \
	static gdr_CUresult w_ctx_##i(gdr_CUcontext ctx)                                           \
	{                                                                                          \
		gdr_events_push(0, GDR_EVENT_ALL_LEN);                                             \
		return ((ctx_fn)REAL(K_CTX, i))(ctx);                                              \
	}                                                                                          \
	static gdr_CUresult w_dev_##i(gdr_CUdevice dev)                                            \
	{                                                                                          \
		gdr_events_push(0, GDR_EVENT_ALL_LEN);                                             \
		return ((dev_fn)REAL(K_DEV, i))(dev);                                              \
	}                                                                                          \
	static gdr_CUresult w_gpa1_##i(const char *sym, void **pfn, int version, uint64_t flags)   \
	{                                                                                          \
		gdr_CUresult rc = ((gdr_cuGetProcAddress_v1_t)REAL(K_GPA1, i))(sym, pfn, version,  \
										flags);            \
		if (rc == GDR_CUDA_SUCCESS && pfn && *pfn)                                         \
			*pfn = wrap(gpa_kind(sym, version), *pfn);                                 \
		return rc;                                                                         \
	}                                                                                          \
	static gdr_CUresult w_gpa2_##i(const char *sym, void **pfn, int version, uint64_t flags,   \
				       int *status)                                                \
	{                                                                                          \
		gdr_CUresult rc = ((gdr_cuGetProcAddress_v2_t)REAL(K_GPA2, i))(sym, pfn, version,  \
										flags, status);    \
		if (rc == GDR_CUDA_SUCCESS && pfn && *pfn)                                         \
			*pfn = wrap(gpa_kind(sym, version), *pfn);                                 \
		return rc;                                                                         \
	}

DEFINE_SLOT(0)
DEFINE_SLOT(1)
DEFINE_SLOT(2)
DEFINE_SLOT(3)

#define SLOT_ROW(name) { (void *)name##_0, (void *)name##_1, (void *)name##_2, (void *)name##_3 }
static void *const wrappers[K_COUNT][GDR_HOOK_SLOTS] = {
	[K_FREE] = SLOT_ROW(w_free),           [K_FREE32] = SLOT_ROW(w_free32),
	[K_FREE_ASYNC] = SLOT_ROW(w_free_async), [K_FREE_HOST] = SLOT_ROW(w_free_host),
	[K_UNMAP] = SLOT_ROW(w_unmap),         [K_CTX] = SLOT_ROW(w_ctx),
	[K_DEV] = SLOT_ROW(w_dev),             [K_GPA1] = SLOT_ROW(w_gpa1),
	[K_GPA2] = SLOT_ROW(w_gpa2),
};

static bool is_ours(void *fn)
{
	for (int k = 0; k < K_COUNT; k++)
		for (int i = 0; i < GDR_HOOK_SLOTS; i++)
			if (wrappers[k][i] == fn)
				return true;
	if (gdr_hooks_exported)
		for (void *const *e = gdr_hooks_exported; *e; e++)
			if (*e == fn)
				return true;
	return false;
}

/* The wrapper bound to real (binding a free slot to it if none is yet), or real itself. */
static void *wrap(enum hook_kind k, void *real)
{
	if (k == K_NONE || !real || is_ours(real))
		return real;
	for (int i = 0; i < GDR_HOOK_SLOTS; i++) {
		void *cur = REAL(k, i);

		if (!cur && __atomic_compare_exchange_n(&slot_real[k][i], &cur, real, false,
							__ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			return wrappers[k][i];
		if (cur == real)
			return wrappers[k][i];
	}
	__atomic_store_n(&slots_exhausted, 1, __ATOMIC_RELAXED);
	return real;
}

/* Names as cuGetProcAddress takes them (base names; the version and flags pick the variant). */
static enum hook_kind gpa_kind(const char *s, int version)
{
	if (s[0] != 'c' || s[1] != 'u')
		return K_NONE;
	s += 2;
	if (streq(s, "MemFree"))
		return version >= 3020 ? K_FREE : K_FREE32;
	if (streq(s, "MemFreeAsync"))
		return K_FREE_ASYNC;
	if (streq(s, "MemFreeHost"))
		return K_FREE_HOST;
	if (streq(s, "MemUnmap"))
		return K_UNMAP;
	if (streq(s, "IpcCloseMemHandle"))
		return K_FREE;
	if (streq(s, "CtxDestroy"))
		return K_CTX;
	if (streq(s, "DevicePrimaryCtxReset") || streq(s, "DevicePrimaryCtxRelease"))
		return K_DEV;
	if (streq(s, "GetProcAddress"))
		return version >= 12000 ? K_GPA2 : K_GPA1;
	return K_NONE;
}

/* Names as libcuda exports them (the unsuffixed ones keep their oldest ABI). */
static GDR_NO_SANITIZE enum hook_kind export_kind(const char *s)
{
	if (s[0] != 'c' || s[1] != 'u')
		return K_NONE;
	s += 2;
	if (streq(s, "MemFree"))
		return K_FREE32;
	if (streq(s, "MemFree_v2") || streq(s, "IpcCloseMemHandle"))
		return K_FREE;
	if (streq(s, "MemFreeAsync") || streq(s, "MemFreeAsync_ptsz"))
		return K_FREE_ASYNC;
	if (streq(s, "MemFreeHost"))
		return K_FREE_HOST;
	if (streq(s, "MemUnmap"))
		return K_UNMAP;
	if (streq(s, "CtxDestroy") || streq(s, "CtxDestroy_v2"))
		return K_CTX;
	if (streq(s, "DevicePrimaryCtxReset") || streq(s, "DevicePrimaryCtxReset_v2") ||
	    streq(s, "DevicePrimaryCtxRelease") || streq(s, "DevicePrimaryCtxRelease_v2"))
		return K_DEV;
	if (streq(s, "GetProcAddress"))
		return K_GPA1;
	if (streq(s, "GetProcAddress_v2"))
		return K_GPA2;
	return K_NONE;
}

/* ---- The routes (hooks_export.c's trampolines jump where these say) ---------------------------- */

static void *hooked_dlsym(void *h, const char *name)
{
	dlsym_fn f = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);

	return wrap(export_kind(name), f(h, name));
}

static void *hooked_dlvsym(void *h, const char *name, const char *version)
{
	dlvsym_fn f = __atomic_load_n(&real_dlvsym, __ATOMIC_ACQUIRE);

	return wrap(export_kind(name), f(h, name, version));
}

GDR_NO_SANITIZE void *gdr_hooks_dlsym_route(void *h, const char *name)
{
	dlsym_fn f;

	hooks_init();
	f = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
	if (!f)
		return (void *)no_dlsym;
	if (h != RTLD_NEXT && name && export_kind(name) != K_NONE)
		return (void *)hooked_dlsym;
	return (void *)f;
}

static void *no_dlvsym(void *h, const char *name, const char *version)
{
	(void)h, (void)name, (void)version;
	return NULL;
}

GDR_NO_SANITIZE void *gdr_hooks_dlvsym_route(void *h, const char *name, const char *version)
{
	dlvsym_fn f;

	(void)version;
	hooks_init();
	f = __atomic_load_n(&real_dlvsym, __ATOMIC_ACQUIRE);
	if (!f)
		return (void *)no_dlvsym;
	if (h != RTLD_NEXT && name && export_kind(name) != K_NONE)
		return (void *)hooked_dlvsym;
	return (void *)f;
}

void *gdr_hooks_wrap_proc(const char *sym, int version, void *fn)
{
	return sym ? wrap(gpa_kind(sym, version), fn) : fn;
}

void *gdr_hooks_libcuda_sym(const char *name)
{
	void *h = gdr_cuda_libcuda_handle(), *fn;
	dlsym_fn f;

	hooks_init();
	f = __atomic_load_n(&libc_dlsym, __ATOMIC_ACQUIRE);
	if (!f)
		return NULL;
	if (!h)
		h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
	if (!h)
		return NULL;
	/* A handle lookup searches libcuda and its dependencies, never libgdrcache. */
	fn = f(h, name);
	return is_ours(fn) ? NULL : fn;
}

/* ---- The probe -------------------------------------------------------------------------------- */

#define PROBE_SIZE (2u << 20) /* its own 2 MiB chunk: no cached registration can overlap it */

/* Whether an event for va was published at or after seq. */
static bool event_seen(uint64_t seq, uint64_t va)
{
	uint64_t head = gdr_events_head();
	struct gdr_event ev;

	for (; seq < head; seq++) {
		int rc;

		while ((rc = gdr_events_get(seq, &ev)) == -EAGAIN)
			;
		if (rc == 0 && ev.start == va && ev.len == 0)
			return true;
	}
	return false;
}

/* Allocates with alloc, frees with fr, and says whether the free was seen. */
static int probe_path(gdr_CUresult (*alloc)(gdr_CUdeviceptr *, size_t), free_fn fr,
		      const char **why, const char *fail)
{
	gdr_CUdeviceptr p = 0;
	uint64_t seq;
	int rc = alloc(&p, PROBE_SIZE);

	if (rc != GDR_CUDA_SUCCESS || !p) {
		*why = "test allocation failed (cuMemAlloc)";
		return -EIO;
	}
	seq = gdr_events_head();
	rc = fr(p);
	if (!event_seen(seq, p)) {
		*why = fail;
		return -ENOSYS;
	}
	return rc == GDR_CUDA_SUCCESS ? 0 : (*why = "test free failed (cuMemFree)", -EIO);
}

static int probe_rc;
static const char *probe_why;

static void probe_once(void)
{
	static const char not_interposed[] =
		"dlsym is not libgdrcache's: it was loaded after libc (dlopen'ed?); link it "
		"(-lgdrcache) or LD_PRELOAD it";
	gdr_CUresult (*alloc)(gdr_CUdeviceptr *, size_t) = NULL;
	const char *why = NULL;
	void *h, *gpa, *fr = NULL, *fr2;
	gdr_CUcontext borrowed;
	int rc, st = 0;

	if (gdr_cuda_load() || !(h = gdr_cuda_libcuda_handle())) {
		probe_rc = -ENODEV, probe_why = "no CUDA driver";
		return;
	}
	/* (a) the CUDA runtime's path: dlsym(libcuda, "cuGetProcAddress_v2"), then through it. This
	 * dlsym is whatever the global scope binds for this library, as for any other object. */
	gpa = dlsym(h, "cuGetProcAddress_v2");
	if (gpa) {
		if (!is_ours(gpa))
			goto not_ours;
		((gdr_cuGetProcAddress_v2_t)gpa)("cuMemAlloc", (void **)&alloc, 12000, 0, &st);
		((gdr_cuGetProcAddress_v2_t)gpa)("cuMemFree", &fr, 12000, 0, &st);
	} else if ((gpa = dlsym(h, "cuGetProcAddress"))) {
		if (!is_ours(gpa))
			goto not_ours;
		((gdr_cuGetProcAddress_v1_t)gpa)("cuMemAlloc", (void **)&alloc, 12000, 0);
		((gdr_cuGetProcAddress_v1_t)gpa)("cuMemFree", &fr, 12000, 0);
	}
	if (!alloc || !fr) {
		probe_rc = -ENOSYS, probe_why = "cuGetProcAddress lacks cuMemAlloc / cuMemFree";
		return;
	}
	if (!is_ours(fr)) {
		probe_rc = -ENOSYS, probe_why = "cuGetProcAddress(\"cuMemFree\") was not wrapped";
		return;
	}
	borrowed = gdr_cuda_context_borrow(0, &rc);
	if (rc) {
		probe_rc = rc, probe_why = "no CUDA context for the test allocation";
		return;
	}
	rc = probe_path(alloc, (free_fn)fr, &why, "a free through cuGetProcAddress was not seen");
	/* (b) dlsym(libcuda handle, "cuMemFree_v2"), as PyTorch looks functions up */
	fr2 = rc ? NULL : dlsym(h, "cuMemFree_v2");
	if (fr2)
		rc = probe_path(alloc, (free_fn)fr2, &why,
				"a free through dlsym(libcuda, \"cuMemFree_v2\") was not seen");
	/* (c) a program linked with -lcuda calls cuMemFree_v2 directly: the dynamic linker binds the
	 * first definition in the global scope, our forwarder or libcuda's own. Asked of the real
	 * dlsym (ours would hand back a wrapper whichever it is). */
	fr2 = rc ? NULL : gdr_hooks_real_dlsym(RTLD_DEFAULT, "cuMemFree_v2");
	if (fr2)
		rc = probe_path(alloc, (free_fn)fr2, &why,
				"a free through dlsym(RTLD_DEFAULT, \"cuMemFree_v2\") was not seen");
	gdr_cuda_context_return(borrowed);
	if (!rc && __atomic_load_n(&slots_exhausted, __ATOMIC_RELAXED))
		rc = -ENOSPC, why = "more driver entry points than wrapper slots";
	probe_rc = rc, probe_why = rc ? why : "free interception proven";
	return;
not_ours:
	probe_rc = -ENOSYS, probe_why = not_interposed;
}

int gdr_events_probe(const char **why)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, probe_once);
	if (why)
		*why = probe_why;
	return probe_rc;
}
