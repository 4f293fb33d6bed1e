/* SPDX-License-Identifier: MIT */
/*
 * dlsym and dlvsym, so that programs which dlopen libibverbs and resolve its registration
 * functions themselves (NCCL: dlopen("libibverbs.so"), dlvsym(handle, name, "IBVERBS_1.1"),
 * ibv_reg_mr_iova2 at IBVERBS_1.8, ibv_reg_dmabuf_mr at IBVERBS_1.12) get the preload's
 * interposers, as a program linked against libibverbs does.
 *
 * The preload exports both under glibc's version nodes (dlsym@@GLIBC_2.34 and the compat node a
 * program linked against glibc < 2.34 refers to: GLIBC_2.2.5 on x86-64, GLIBC_2.17 on aarch64;
 * libgdrcache-preload.map), so every reference in the process binds here first. Each is a few
 * instructions that save the arguments, ask a route (C) which function the call should go to,
 * restore the arguments and JUMP there: the function reached sees the caller's return address,
 * from which glibc computes what RTLD_NEXT means (and RTLD_DEFAULT's namespace). A forwarder
 * written in C is a tail call only when the optimiser makes it one (-O0 and ASan builds do not),
 * and would make every RTLD_NEXT lookup relative to this library.
 *
 * The routes: RTLD_NEXT, and any name that is not an "ibv_" one, go straight to the real function
 * (what the lookups by the sanitizer runtimes, libgdrcache and everyone else meet). An "ibv_" name
 * looked up in a handle or RTLD_DEFAULT goes to a lookup that asks the real function and hands the
 * result to gdrp_verbs_lookup() (interpose.c): libibverbs' own definition of an interposed entry
 * point becomes the preload's interposer of that definition, so each version node maps to its own.
 *
 * The real functions: libc's dlsym / dlvsym, found by reading libc.so.6's symbol table through the
 * link map (this library defines both names, and the routes run before any constructor: inside
 * the sanitizer runtimes' start-up, which look up what they intercept with dlsym(RTLD_NEXT, ...)
 * and find ours), then asked for the next definitions after this library (another interposer's,
 * usually libc's own). Nothing on that path may be instrumented: GDRP_NO_SANITIZE.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "preload.h"

#define GDRP_NO_SANITIZE __attribute__((no_sanitize("address", "undefined", "thread")))

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static dlsym_fn real_dlsym;
static dlvsym_fn real_dlvsym;

/* No libc string functions here: the sanitizers intercept them, and this runs before they start. */
static GDRP_NO_SANITIZE bool streq(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

static GDRP_NO_SANITIZE bool is_libc(const char *path)
{
	const char *base = path;

	for (const char *p = path; *p; p++)
		if (*p == '/')
			base = p + 1;
	return streq(base, "libc.so.6");
}

GDRP_NO_SANITIZE uintptr_t gdrp_dyn(const struct link_map *l, long tag, bool addr)
{
	for (const ElfW(Dyn) *d = l->l_ld; d->d_tag != DT_NULL; d++) {
		if (d->d_tag != tag)
			continue;
		/* glibc relocates addresses in place where the dynamic section is writable */
		if (addr && d->d_un.d_ptr < l->l_addr)
			return d->d_un.d_ptr + l->l_addr;
		return d->d_un.d_ptr;
	}
	return 0;
}

/* The default-version definition of name in a loaded object, from its GNU hash table. */
static GDRP_NO_SANITIZE void *elf_lookup(const struct link_map *l, const char *name)
{
	const ElfW(Sym) *symtab = (const void *)gdrp_dyn(l, DT_SYMTAB, true);
	const ElfW(Half) *versym = (const void *)gdrp_dyn(l, DT_VERSYM, true);
	const uint32_t *gnu = (const void *)gdrp_dyn(l, DT_GNU_HASH, true);
	const char *strtab = (const void *)gdrp_dyn(l, DT_STRTAB, true);
	uint32_t h = 5381;

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

		/* versym bit 15: hidden, a non-default version (dlsym@GLIBC_2.2.5) */
		if ((ch | 1) == (h | 1) && symtab[i].st_shndx != SHN_UNDEF &&
		    streq(strtab + symtab[i].st_name, name) && (!versym || !(versym[i] & 0x8000)))
			return (void *)(l->l_addr + symtab[i].st_value);
		if (ch & 1)
			break;
	}
	return NULL;
}

/* Idempotent: threads racing here store the same values. */
static GDRP_NO_SANITIZE void real_init(void)
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
		return; /* not glibc: every lookup fails (no_dlsym) */
	/* Called from here, RTLD_NEXT means "after this library". */
	nv = (dlvsym_fn)lv(RTLD_NEXT, "dlvsym", "GLIBC_2.34");
	ns = (dlsym_fn)lv(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	__atomic_store_n(&real_dlvsym, nv ? nv : lv, __ATOMIC_RELEASE);
	__atomic_store_n(&real_dlsym, ns ? ns : ls, __ATOMIC_RELEASE);
}

/* Never a tail call (the empty asm uses the result): glibc counts RTLD_NEXT from the return
 * address, which must be in this library, not in whoever called into it. */
void *gdrp_real_dlsym(void *h, const char *name)
{
	dlsym_fn f;
	void *r;

	real_init();
	f = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
	r = f ? f(h, name) : NULL;
	__asm__ volatile("" : "+r"(r));
	return r;
}

void *gdrp_real_dlvsym(void *h, const char *name, const char *version)
{
	dlvsym_fn f;
	void *r;

	real_init();
	f = __atomic_load_n(&real_dlvsym, __ATOMIC_ACQUIRE);
	r = f ? f(h, name, version) : NULL;
	__asm__ volatile("" : "+r"(r));
	return r;
}

/* ---- The routes (the trampolines below jump where these say) --------------------------------- */

static void *no_dlsym(void *h, const char *name)
{
	(void)h, (void)name;
	return NULL;
}

static void *no_dlvsym(void *h, const char *name, const char *version)
{
	(void)h, (void)name, (void)version;
	return NULL;
}

/* A lookup in a handle or RTLD_DEFAULT that may meet one of libibverbs' interposed definitions. */
static void *verbs_dlsym(void *h, const char *name)
{
	return gdrp_verbs_lookup(gdrp_real_dlsym(h, name), name, NULL);
}

static void *verbs_dlvsym(void *h, const char *name, const char *version)
{
	return gdrp_verbs_lookup(gdrp_real_dlvsym(h, name, version), name, version);
}

static GDRP_NO_SANITIZE bool verbs_name(void *h, const char *name)
{
	return h != RTLD_NEXT && name && name[0] == 'i' && name[1] == 'b' && name[2] == 'v' &&
	       name[3] == '_';
}

GDRP_NO_SANITIZE void *gdrp_dlsym_route(void *h, const char *name);
GDRP_NO_SANITIZE void *gdrp_dlsym_route(void *h, const char *name)
{
	dlsym_fn f;

	real_init();
	f = __atomic_load_n(&real_dlsym, __ATOMIC_ACQUIRE);
	if (!f)
		return (void *)no_dlsym;
	return verbs_name(h, name) ? (void *)verbs_dlsym : (void *)f;
}

GDRP_NO_SANITIZE void *gdrp_dlvsym_route(void *h, const char *name, const char *version);
GDRP_NO_SANITIZE void *gdrp_dlvsym_route(void *h, const char *name, const char *version)
{
	dlvsym_fn f;

	(void)version;
	real_init();
	f = __atomic_load_n(&real_dlvsym, __ATOMIC_ACQUIRE);
	if (!f)
		return (void *)no_dlvsym;
	return verbs_name(h, name) ? (void *)verbs_dlvsym : (void *)f;
}

/* The exported entries dlsym and dlvsym: per-architecture trampolines to the routes above
 * (arch/<arch>.c). */
