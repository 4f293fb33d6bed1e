/* SPDX-License-Identifier: MIT */
/*
 * The architecture-independent half of the entry patcher (patch.h): the lock, the table of
 * patched targets, trampoline memory within branch reach of a target, and making the target's
 * page writable for the one store that patches it.
 *
 * Trampoline memory: anonymous pages found in /proc/self/maps' gaps within the architecture's
 * reach of the target (mapped with MAP_FIXED_NOREPLACE, the address checked), GDR_PATCH_SLOT
 * bytes per patch. A new page is written while read+write and then made read+execute; a page that
 * already holds trampolines is made read+write+execute only while a slot is written (threads may
 * be running its other trampolines), and read+execute again at once: never writable at rest.
 *
 * Threads and the patch. The entry is rewritten by ONE aligned atomic store (patch_<arch>.c): an
 * instruction fetch sees the old bytes or the new ones, never a mix, so a call that enters the
 * target before the store runs the original code, and one that enters after it runs the hook.
 * The stub, orig and the table entry are complete before the store, so a thread that takes the
 * new branch finds them. A thread already INSIDE the target (past its first instruction, perhaps
 * preempted there) must find the rest of the bytes as they were:
 *  - x86-64, the one-byte form (tried first): only byte 0 becomes E9; bytes 1-4, unchanged, are
 *    the jump's displacement, and the stub is mapped at exactly the address they name
 *    (target + 5 + disp, about 1 GiB above libcuda 580's functions). Every byte after the first
 *    instruction is untouched: a thread past it runs on as before. orig is the first instruction
 *    moved, then a jump to target + its length. Needs that address free (or in a stub page of
 *    ours); pages there are mapped with MAP_FIXED_NOREPLACE and never given back.
 *  - x86-64, the five-byte form: whole instructions covering 5 bytes are moved (libcuda 580:
 *    push rbp; mov rbp,rsp; push r12). A thread stopped after the first of them resumes in the
 *    middle of the jump and crashes (4 of 40 patches under 8 calling threads on 2 cores, in a
 *    deliberate stress). So it is written only with GDR_PATCH_QUIESCENT: the caller has just
 *    loaded the library and no thread can be inside it.
 *  - aarch64 replaces one instruction, so no thread can be inside what moved; but the
 *    architecture guarantees concurrent modification + execution only between B, BL, NOP, BRK,
 *    SVC, HVC, SMC and ISB, and the replaced instruction (e.g. STP) is not one of those. Linux's
 *    ftrace relies on the same in practice.
 *  - x86 cross-modifying code formally needs a serializing instruction on the executing core; an
 *    aligned locked store is what every user-space patcher relies on.
 *  - A branch from elsewhere into the moved bytes (a loop back to the second instruction) would
 *    land in the jump: compilers do not emit that into a prologue, and nothing here checks it.
 * Installs are serialised by a mutex; gdr_patch_is_patched reads the table without it (entries
 * are filled before the count that publishes them). Patches are never removed.
 *
 * Another patcher's jump at the entry (UCX's bistro: docs/FACTS.md, "Two patchers"). UCX writes
 * `jmp rel32` (E9) where its hook is within +-2 GiB, else `movabs $hook, %rax; jmp *%rax`
 * (x86-64), and `ldr x15, #8; br x15; .quad hook` (aarch64), after holding the entry on a jump to
 * itself (EB FE, `b .`) for a grace time; it relocates only the prologue instructions it knows, so
 * it refuses an entry that is our jump (its decoder knows no E9, B or FF), writing nothing. Here:
 * an E9, a movabs (10 bytes), B or LDR+BR at the entry is ONE instruction covering the branch this
 * patcher writes, so a thread is before it or past it (past the movabs, %rax is loaded and the
 * jmp *%rax after it is untouched), and it is replaced in one atomic store without
 * GDR_PATCH_QUIESCENT; orig is an absolute jump to where it went, so it depends on no byte of the
 * entry: if UCX wrote its saved bytes back (its library never does), orig would still be right.
 * (Moving the movabs as an ordinary instruction would make orig return into the entry, at the
 * jmp *%rax, which a restore turns into the middle of the original prologue.)
 * The recognisers below know the architectures' encodings, which belong in arch/ (they are here
 * until arch/ can take them: one file per concern).
 *
 * Nothing here allocates from the heap or logs: install time may be inside the dynamic loader's
 * or a sanitizer's own start-up; failures come back as -errno and a static reason.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "intercept/patch.h"
#include "intercept/stop_world.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MAX_PATCHES 128
#define MAX_PAGES 64
#define MAX_CANDIDATES 8
/* No trampoline page below this address (mmap_min_addr is 64 KiB; stay clear of it). */
#define ADDR_FLOOR (1ULL << 20)
/* Above this, no user address on any 4- or 5-level x86-64 or 48-bit aarch64 kernel by default. */
#define ADDR_TOP (1ULL << 47)

static pthread_mutex_t patch_lock = PTHREAD_MUTEX_INITIALIZER;

static struct {
	const void *target;
	void *orig;
	unsigned bytes; /* bytes of the entry rewritten: 1 (the one-byte form), 5, or 4 (aarch64) */
	bool stopped;   /* written while every other thread was stopped (stop_world.h) */
} patches[MAX_PATCHES];
static unsigned npatches; /* stored with release after the entry it counts is filled */

static struct {
	uintptr_t base;
	size_t used;
} pages[MAX_PAGES];
static unsigned npages;

/* The one-byte form's stubs, each at the address its entry's bytes name, and their pages. */
static uintptr_t stubs[MAX_PATCHES];
static unsigned nstubs;
static uintptr_t stub_pages[MAX_PAGES];
static unsigned nstub_pages;

#if !defined(__x86_64__) && !defined(__aarch64__)
const struct gdr_patch_arch *gdr_patch_arch(void)
{
	return NULL;
}
#endif

/* ---- /proc/self/maps, read without the heap -------------------------------------------------- */

struct mapping {
	uintptr_t start, end;
	int prot;
	bool stack;
	bool file; /* a file's mapping (inode not 0): a loaded object's code, not a trampoline */
};

/* Fills m from one line of /proc/self/maps: 0, or -EINVAL if it does not parse. */
static int parse_line(const char *line, struct mapping *m)
{
	char *p;

	m->start = strtoull(line, &p, 16);
	if (*p != '-')
		return -EINVAL;
	m->end = strtoull(p + 1, &p, 16);
	if (*p != ' ' || strlen(p) < 5 || m->end <= m->start)
		return -EINVAL;
	m->prot = (p[1] == 'r' ? PROT_READ : 0) | (p[2] == 'w' ? PROT_WRITE : 0) |
		  (p[3] == 'x' ? PROT_EXEC : 0);
	m->stack = strstr(p, "[stack") != NULL;
	{
		unsigned long inode = 0;

		m->file = sscanf(p, " %*4s %*x %*x:%*x %lu", &inode) == 1 && inode != 0;
	}
	return 0;
}

/* Calls fn for each mapping in address order until it returns non-zero, which is returned; 0 at
 * the end, -errno if the file cannot be read. A line longer than the buffer is parsed from its
 * head (its path, at the end, is cut). */
static int maps_walk(int (*fn)(const struct mapping *m, void *arg), void *arg)
{
	char buf[4096];
	size_t len = 0;
	bool in_long_line = false;
	struct mapping m;
	int fd, rc = 0;

	fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	for (;;) {
		ssize_t n = read(fd, buf + len, sizeof(buf) - 1 - len);
		char *p = buf, *nl;

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			rc = -errno;
			break;
		}
		len += n;
		if (n == 0 && len && buf[len - 1] != '\n')
			buf[len++] = '\n'; /* a last line without its newline (room kept above) */
		while (!rc && (nl = memchr(p, '\n', buf + len - p))) {
			*nl = '\0';
			if (!in_long_line && !parse_line(p, &m))
				rc = fn(&m, arg);
			in_long_line = false;
			p = nl + 1;
		}
		if (rc || n == 0)
			break;
		len = buf + len - p;
		if (len == sizeof(buf) - 1) { /* one line fills the buffer: keep its head only */
			buf[len] = '\0';
			if (!parse_line(buf, &m))
				rc = fn(&m, arg);
			if (rc)
				break;
			in_long_line = true;
			len = 0;
		} else {
			memmove(buf, p, len);
		}
	}
	close(fd);
	return rc;
}

struct find_arg {
	uintptr_t addr;
	struct mapping m;
};

static int find_one(const struct mapping *m, void *arg)
{
	struct find_arg *f = arg;

	if (f->addr < m->start || f->addr >= m->end)
		return 0;
	f->m = *m;
	return 1;
}

/* The mapping that holds addr: 0, or -EINVAL if none does (-errno if maps cannot be read). */
static int find_mapping(uintptr_t addr, struct mapping *m)
{
	struct find_arg f = { .addr = addr };
	int rc = maps_walk(find_one, &f);

	if (rc < 0)
		return rc;
	if (!rc)
		return -EINVAL;
	*m = f.m;
	return 0;
}

/* ---- Trampoline memory ----------------------------------------------------------------------- */

struct gap_arg {
	uintptr_t target, lo, hi; /* a page at [c, c + page) must have lo <= c <= hi */
	size_t page;
	uintptr_t prev_end;
	uintptr_t stack_room; /* left free below a stack */
	unsigned n;
	uintptr_t cand[MAX_CANDIDATES];
};

/* What a stack may grow into: its limit (at most STACK_ROOM_MAX, where it is unlimited or
 * larger), plus the kernel's guard gap and a margin. */
#define STACK_ROOM_MAX (1ULL << 30)
#define STACK_MARGIN (16ULL << 20)

static uintptr_t stack_room(void)
{
	struct rlimit rl;
	uint64_t lim = STACK_ROOM_MAX;

	if (!getrlimit(RLIMIT_STACK, &rl) && rl.rlim_cur != RLIM_INFINITY &&
	    rl.rlim_cur < STACK_ROOM_MAX)
		lim = rl.rlim_cur;
	return (uintptr_t)(lim + STACK_MARGIN);
}

static uintptr_t dist(uintptr_t a, uintptr_t b)
{
	return a > b ? a - b : b - a;
}

/* Offers the page in the gap [start, end) nearest the target, keeping the nearest candidates. */
static void gap_offer(struct gap_arg *g, uintptr_t start, uintptr_t end)
{
	uintptr_t lo = start > g->lo ? start : g->lo, hi, c;
	unsigned i;

	if (end < start + g->page)
		return;
	hi = end - g->page < g->hi ? end - g->page : g->hi;
	if (lo > hi)
		return;
	c = g->target & ~(uintptr_t)(g->page - 1);
	c = c < lo ? lo : c > hi ? hi : c;
	for (i = g->n; i > 0 && dist(g->cand[i - 1], g->target) > dist(c, g->target); i--)
		if (i < MAX_CANDIDATES)
			g->cand[i] = g->cand[i - 1];
	if (i < MAX_CANDIDATES) {
		g->cand[i] = c;
		if (g->n < MAX_CANDIDATES)
			g->n++;
	}
}

static int gap_one(const struct mapping *m, void *arg)
{
	struct gap_arg *g = arg;
	uintptr_t end = m->start;

	/* Below a stack lies the room it grows into (and the kernel's guard gap): leave that much,
	 * not the whole gap (where a library's neighbours are taken, as by a driver's reservation
	 * of virtual addresses just below it, the gap up to the stack may be all that is in reach). */
	if (m->stack)
		end = end > g->prev_end + g->stack_room ? end - g->stack_room : g->prev_end;
	if (end > g->prev_end)
		gap_offer(g, g->prev_end, end);
	if (m->end > g->prev_end)
		g->prev_end = m->end;
	return 0;
}

/* Maps a read+write page within reach of target: its address, or 0. */
static uintptr_t page_new(const struct gdr_patch_arch *a, uintptr_t target, size_t page)
{
	struct gap_arg g = {
		.target = target, .page = page, .prev_end = ADDR_FLOOR, .stack_room = stack_room()
	};
	uintptr_t reach = a->reach & ~(uintptr_t)(page - 1);

	g.lo = target > ADDR_FLOOR + reach ? target - reach : ADDR_FLOOR;
	g.lo = (g.lo + page - 1) & ~(uintptr_t)(page - 1);
	g.hi = (target + reach - page) & ~(uintptr_t)(page - 1);
	if (maps_walk(gap_one, &g) < 0)
		return 0;
	if (g.prev_end < ADDR_TOP)
		gap_offer(&g, g.prev_end, ADDR_TOP);
	for (unsigned i = 0; i < g.n; i++) {
		void *p = mmap((void *)g.cand[i], page, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

		if (p == MAP_FAILED)
			continue; /* taken since maps was read, or refused */
		if ((uintptr_t)p == g.cand[i])
			return g.cand[i];
		munmap(p, page); /* a kernel before 4.17 took the address as a hint only */
	}
	return 0;
}

/* Writes target's stub and orig into a slot of trampoline memory within reach: the slot, or NULL
 * (-ENOMEM). The slot's page is read+execute again on return. */
static uint8_t *slot_write(const struct gdr_patch_arch *a, const void *target, const uint8_t *code,
			   unsigned moved, const void *hook, size_t page)
{
	uintptr_t t = (uintptr_t)target, lo = t - a->reach, hi = t + a->reach - page;
	unsigned i;
	uint8_t *slot;

	if (t < a->reach)
		lo = 0;
	for (i = 0; i < npages; i++) {
		if (pages[i].base < lo || pages[i].base > hi ||
		    pages[i].used + GDR_PATCH_SLOT > page)
			continue;
		/* Others of its trampolines may be running: keep it executable while writing. */
		if (!mprotect((void *)pages[i].base, page, PROT_READ | PROT_WRITE | PROT_EXEC))
			break;
	}
	if (i == npages) {
		uintptr_t base;

		if (npages == MAX_PAGES)
			return NULL;
		base = page_new(a, t, page);
		if (!base)
			return NULL;
		pages[npages].base = base;
		pages[npages].used = 0;
		npages++;
	}
	slot = (uint8_t *)pages[i].base + pages[i].used;
	a->emit(slot, target, code, moved, hook);
	if (mprotect((void *)pages[i].base, page, PROT_READ | PROT_EXEC))
		return NULL; /* the slot stays free */
	pages[i].used += GDR_PATCH_SLOT;
	__builtin___clear_cache((char *)slot, (char *)slot + GDR_PATCH_SLOT);
	return slot;
}

/* Gives back the slot last written (a patch that failed after slot_write). */
static void slot_unwrite(const uint8_t *slot)
{
	for (unsigned i = 0; i < npages; i++)
		if (pages[i].used &&
		    (uintptr_t)slot == pages[i].base + pages[i].used - GDR_PATCH_SLOT)
			pages[i].used -= GDR_PATCH_SLOT;
}

/* ---- Another patcher's jump at the entry ------------------------------------------------------ */

struct jump {
	uintptr_t dest; /* where it goes (0: through a pointer, at ptr) */
	uintptr_t ptr;  /* x86-64 jmp *disp(%rip): the address of the pointer it jumps through */
	unsigned len;   /* bytes of its first instruction */
	bool chain; /* one instruction covering the entry's branch: replaced, orig jumps to dest */
	const char *form; /* what it is, for gdr_patch_foreign's text */
};

static int64_t sext(uint64_t v, unsigned bits)
{
	return (int64_t)(v << (64 - bits)) >> (64 - bits);
}

/* Whether the entry at t, whose first avail bytes are code, begins with a jump (*j filled). */
static bool jump_at(uintptr_t t, const uint8_t *code, size_t avail, struct jump *j)
{
	memset(j, 0, sizeof(*j));
#if defined(__x86_64__)
	if (avail >= 5 && code[0] == 0xe9) { /* jmp rel32: UCX's near form */
		int32_t rel;

		memcpy(&rel, code + 1, sizeof(rel));
		*j = (struct jump){ .dest = t + 5 + (uintptr_t)(intptr_t)rel,
				    .len = 5,
				    .chain = true,
				    .form = "jmp rel32" };
		return true;
	}
	if (avail >= 2 && code[0] == 0xeb) { /* jmp rel8 (EB FE: UCX's lock) */
		*j = (struct jump){ .dest = t + 2 + (uintptr_t)sext(code[1], 8),
				    .len = 2,
				    .form = "jmp rel8" };
		return true;
	}
	if (avail >= 6 && code[0] == 0xff && code[1] == 0x25) { /* jmp *disp32(%rip) */
		int32_t rel;

		memcpy(&rel, code + 2, sizeof(rel));
		*j = (struct jump){ .ptr = t + 6 + (uintptr_t)(intptr_t)rel,
				    .len = 6,
				    .form = "jmp *(%rip)" };
		return true;
	}
	/* movabs $imm64, %reg; jmp *%reg: UCX's far form (%rax), or through r8-r15 */
	if (avail >= 12 && (code[0] & 0xfe) == 0x48 && (code[1] & 0xf8) == 0xb8) {
		unsigned reg = (code[1] & 7) | (code[0] & 1) << 3;
		bool jmp_reg = reg < 8 ? code[10] == 0xff && code[11] == 0xe0 + reg
				       : avail >= 13 && code[10] == 0x41 && code[11] == 0xff &&
						 code[12] == 0xe0 + (reg - 8);
		uint64_t imm;

		if (!jmp_reg)
			return false;
		memcpy(&imm, code + 2, sizeof(imm));
		*j = (struct jump){
			.dest = imm, .len = 10, .chain = true, .form = "movabs+jmp *reg"
		};
		return true;
	}
#elif defined(__aarch64__)
	uint32_t insn, next;

	if (avail < 4)
		return false;
	memcpy(&insn, code, sizeof(insn));
	if ((insn & 0xfc000000) == 0x14000000) { /* B (b .: UCX's lock) */
		*j = (struct jump){ .dest = t + (uintptr_t)(sext(insn & 0x03ffffff, 26) * 4),
				    .len = 4,
				    .chain = true,
				    .form = "B" };
		return true;
	}
	if ((insn & 0xff000000) == 0x58000000 && avail >= 8) { /* LDR Xn, literal; BR Xn: UCX's */
		int64_t off = sext(insn >> 5 & 0x7ffff, 19) * 4;
		uint64_t dest;

		memcpy(&next, code + 4, sizeof(next));
		if (next != (0xd61f0000 | (insn & 31) << 5))
			return false;
		if (off < 8 || (uint64_t)off + 8 > avail) /* the literal among the bytes read */
			return false;
		memcpy(&dest, code + off, sizeof(dest));
		*j = (struct jump){ .dest = dest, .len = 4, .chain = true, .form = "LDR+BR" };
		return true;
	}
#else
	(void)t, (void)code, (void)avail;
#endif
	return false;
}

/* An absolute jump to dest at out (GDR_PATCH_MAX_MOVED bytes): its length, or 0. */
static unsigned abs_jump(uint8_t *out, uintptr_t dest)
{
#if defined(__x86_64__)
	static const uint8_t jmp[6] = { 0xff, 0x25, 0, 0, 0, 0 }; /* jmp *0(%rip) */

	memcpy(out, jmp, sizeof(jmp));
	memcpy(out + sizeof(jmp), &dest, sizeof(dest));
	return sizeof(jmp) + sizeof(dest);
#elif defined(__aarch64__)
	static const uint32_t jmp[2] = { 0x58000050, 0xd61f0200 }; /* ldr x16, #8; br x16 */

	memcpy(out, jmp, sizeof(jmp));
	memcpy(out + sizeof(jmp), &dest, sizeof(dest));
	return sizeof(jmp) + sizeof(dest);
#else
	(void)out, (void)dest;
	return 0;
#endif
}

/* ---- Installing ------------------------------------------------------------------------------ */

static int refuse(const char **why, const char *reason, int err)
{
	if (why)
		*why = reason;
	return err;
}

/* Bytes to move from the entry (whole instructions covering entry_len), or -ENOTSUP. */
static int decode(const struct gdr_patch_arch *a, const uint8_t *code, size_t avail,
		  const char **why)
{
	unsigned moved = 0;

	while (moved < a->entry_len) {
		int n = a->insn_len(code + moved, avail - moved, why);

		if (n < 0)
			return n;
		moved += n;
	}
	if (moved > GDR_PATCH_MAX_MOVED)
		return refuse(why, "moved instructions too long", -ENOTSUP);
	return moved;
}

/* Whether the stub page at base is ours (-1: no; else its index). */
static int stub_page(uintptr_t base)
{
	for (unsigned i = 0; i < nstub_pages; i++)
		if (stub_pages[i] == base)
			return (int)i;
	return -1;
}

/* Makes [dest, dest + GDR_PATCH_SHORT_STUB) ours and writable: 0, or -ENOMEM. Pages newly mapped
 * stay ours whatever happens next (a later stub may use them). */
static int stub_room(uintptr_t dest, size_t page)
{
	uintptr_t first = dest & ~(uintptr_t)(page - 1);
	uintptr_t last = (dest + GDR_PATCH_SHORT_STUB - 1) & ~(uintptr_t)(page - 1);

	if (dest < ADDR_FLOOR || dest > ADDR_TOP - GDR_PATCH_SHORT_STUB)
		return -ENOMEM;
	for (unsigned i = 0; i < nstubs; i++)
		if (dest < stubs[i] + 16 && stubs[i] < dest + 16)
			return -ENOMEM;
	for (uintptr_t p = first; p <= last; p += page) {
		void *m;

		if (stub_page(p) >= 0) {
			/* other stubs there may be running: stay executable */
			if (mprotect((void *)p, page, PROT_READ | PROT_WRITE | PROT_EXEC))
				return -ENOMEM;
			continue;
		}
		if (nstub_pages == MAX_PAGES)
			return -ENOMEM;
		m = mmap((void *)p, page, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
		if (m == MAP_FAILED)
			return -ENOMEM;
		if ((uintptr_t)m != p) { /* a kernel before 4.17 took the address as a hint */
			munmap(m, page);
			return -ENOMEM;
		}
		memset(m, 0xcc, page);
		stub_pages[nstub_pages++] = p;
	}
	return 0;
}

/* The last step of both forms: orig published, the entry's page made writable for the store
 * (store_bytes: the one-byte form's E9, else the architecture's branch), restored, the table
 * entry counted. 0, or -errno with *why and the slot given back. */
static int commit(const struct gdr_patch_arch *a, void *target, const uint8_t *code,
		  const struct mapping *m, uint8_t *slot, void **orig, unsigned store_bytes,
		  const char **why)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t t = (uintptr_t)target;
	uintptr_t first = t & ~(uintptr_t)(page - 1);
	uintptr_t last = (t + store_bytes - 1) & ~(uintptr_t)(page - 1);
	void *old_orig;
	int rc;

	if (mprotect((void *)first, last + page - first, m->prot | PROT_WRITE)) {
		slot_unwrite(slot);
		return refuse(why, "mprotect of the target's page refused", -EACCES);
	}
	/* The hook may run in other threads as soon as the entry is stored: orig first. */
	old_orig = __atomic_load_n(orig, __ATOMIC_RELAXED);
	__atomic_store_n(orig, slot + GDR_PATCH_ORIG, __ATOMIC_RELEASE);
	patches[npatches].target = target;
	patches[npatches].orig = slot + GDR_PATCH_ORIG;
	patches[npatches].bytes = store_bytes;
	patches[npatches].stopped = false;
	rc = store_bytes == 1 ? a->short_store(target, code[0]) : a->store(target, code, slot);
	mprotect((void *)first, last + page - first, m->prot);
	__builtin___clear_cache((char *)target, (char *)target + store_bytes);
	if (rc) {
		__atomic_store_n(orig, old_orig, __ATOMIC_RELAXED);
		slot_unwrite(slot);
		return refuse(why, "entry changed while being patched", rc);
	}
	__atomic_store_n(&npatches, npatches + 1, __ATOMIC_RELEASE);
	return 0;
}

/* Why the one-byte form was refused where its stub's address lies outside what a process can map:
 * the entry's own bytes put it there (libcuda 580: about 1 GiB above the function), which happens
 * where libraries are loaded within that of the address space's top, as without address space
 * randomisation (setarch -R; gdb runs programs so by default). docs/FACTS.md. */
static const char NO_TRAMPOLINE[] = "no trampoline memory within branch reach";

static const char SHORT_OUTSIDE[] =
	"the address the entry's bytes jump to is outside the address space";

/* The one-byte form (arch/x86_64.c): 0, or -errno with *why, nothing written to the target. */
static int install_short(const struct gdr_patch_arch *a, void *target, const uint8_t *code,
			 size_t avail, const struct mapping *m, void *hook, void **orig,
			 const char **why)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t t = (uintptr_t)target, dest, first, last;
	uint8_t *slot;
	int len, rc;

	len = a->insn_len(code, avail, why);
	if (len < 0)
		return len;
	if (a->short_dest(t, code, avail, &dest))
		return refuse(why, "entry too short for the one-byte form", -ENOTSUP);
	if (dest < ADDR_FLOOR || dest > ADDR_TOP - GDR_PATCH_SHORT_STUB)
		return refuse(why, SHORT_OUTSIDE, -ENOMEM);
	slot = slot_write(a, target, code, (unsigned)len, hook, page);
	if (!slot)
		return refuse(why, NO_TRAMPOLINE, -ENOMEM);
	if (stub_room(dest, page)) {
		slot_unwrite(slot);
		return refuse(why, "the address the entry's bytes jump to is taken", -ENOMEM);
	}
	a->short_stub((uint8_t *)dest, hook);
	first = dest & ~(uintptr_t)(page - 1);
	last = (dest + GDR_PATCH_SHORT_STUB - 1) & ~(uintptr_t)(page - 1);
	for (uintptr_t p = first; p <= last; p += page)
		mprotect((void *)p, page, PROT_READ | PROT_EXEC);
	__builtin___clear_cache((char *)dest, (char *)dest + GDR_PATCH_SHORT_STUB);

	rc = commit(a, target, code, m, slot, orig, 1, why);
	if (!rc)
		stubs[nstubs++] = dest;
	return rc;
}

/* Chains the jump j at the entry: it is replaced by the branch to hook's stub, orig jumps to
 * j->dest (0, or -errno with *why, nothing written). */
static int install_chain(const struct gdr_patch_arch *a, void *target, const uint8_t *code,
			 const struct mapping *m, const struct jump *j, void *hook, void **orig,
			 const char **why)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uint8_t jmp[GDR_PATCH_MAX_MOVED], *slot;
	unsigned n = abs_jump(jmp, j->dest);
	struct mapping dm;

	if (!n || j->len < a->entry_len)
		return refuse(why, "a jump at the entry that cannot be chained", -ENOTSUP);
	/* A jump into a file's code (UCX's bistro jumps to its hook in libucm) is one whole
	 * instruction: whoever wrote it returns past it. A jump into anonymous memory is a
	 * trampoline's, maybe a one-byte form's, whose code returns inside the bytes a chain would
	 * overwrite (another copy of libgdrcache: tests/events/edge_load.c, twice). */
	if (find_mapping(j->dest, &dm) || !dm.file)
		return refuse(why,
			      "a jump at the entry into anonymous memory (another patcher's "
			      "trampoline: a second libgdrcache?): not chained",
			      -ENOTSUP);
	if (a->can_store(target))
		return refuse(why, "entry straddles what one atomic store can write", -EINVAL);
	/* orig: the absolute jump (the branch back emit appends after it is never reached) */
	slot = slot_write(a, target, jmp, n, hook, page);
	if (!slot)
		return refuse(why, NO_TRAMPOLINE, -ENOMEM);
	return commit(a, target, code, m, slot, orig, a->entry_len, why);
}

/* The five-byte form for a target threads may be running: written while every other thread is
 * stopped, any thread inside the moved instructions moved to their copy in orig (stop_world.h).
 * 0, or -errno with *why (before: why the one-byte form was not used), nothing written. */
struct stopped_commit {
	const struct gdr_patch_arch *a;
	void *target;
	const uint8_t *code;
	const struct mapping *m;
	uint8_t *slot;
	void **orig;
	const char **why;
	bool ran;
};

static int stopped_commit_fn(void *arg)
{
	struct stopped_commit *c = arg;

	c->ran = true;
	return commit(c->a, c->target, c->code, c->m, c->slot, c->orig, c->a->entry_len, c->why);
}

static char stopped_why[200]; /* under patch_lock */
static bool stop_gave_up;     /* a stop ran out of time: no more (under patch_lock) */

static int install_stopped(const struct gdr_patch_arch *a, void *target, const uint8_t *code,
			   size_t avail, const struct mapping *m, void *hook, void **orig,
			   unsigned flags, const char *before, const char **why)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	struct stopped_commit c = { a, target, code, m, NULL, orig, why, false };
	struct gdr_stw_region r;
	const char *stw_why = "?";
	int moved, rc;

	if (flags & GDR_PATCH_NO_STOP) {
		snprintf(stopped_why, sizeof(stopped_why), "%s; five-byte jump unsafe%s", before,
			 strstr(before, "taken") ? " while threads may run it" : "");
		return refuse(why, stopped_why, -EBUSY);
	}
	moved = decode(a, code, avail, why);
	if (moved < 0)
		return moved;
	if (a->can_store(target))
		return refuse(why, "entry straddles what one atomic store can write", -EINVAL);
	c.slot = slot_write(a, target, code, (unsigned)moved, hook, page);
	if (!c.slot)
		return refuse(why, NO_TRAMPOLINE, -ENOMEM);
	r = (struct gdr_stw_region){ .start = (uintptr_t)target,
				     .len = (unsigned)moved,
				     .moved_to = (uintptr_t)c.slot + GDR_PATCH_ORIG };
	if (stop_gave_up) {
		stw_why = "an earlier stop ran out of time";
		rc = -EBUSY;
	} else {
		rc = gdr_stw_run(&r, stopped_commit_fn, &c, &stw_why);
		/* threads that did not stop in time once (a sanitizer that defers signals, a thread
		 * spinning with them blocked) will not for the next entry either: no second wait */
		stop_gave_up = !c.ran && rc == -EBUSY && strstr(stw_why, "within");
	}
	if (c.ran) {
		if (!rc)
			patches[npatches - 1].stopped = true;
		return rc; /* commit gave the slot back if it failed */
	}
	slot_unwrite(c.slot);
	snprintf(stopped_why, sizeof(stopped_why), "%s; threads not stopped: %s", before, stw_why);
	return refuse(why, stopped_why, rc);
}

/* Patches target (lock held). */
static int install_locked(const struct gdr_patch_arch *a, void *target, void *hook, void **orig,
			  unsigned flags, const char **why)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t t = (uintptr_t)target;
	uint8_t code[GDR_PATCH_MAX_MOVED], *slot;
	struct mapping m;
	struct jump j;
	size_t avail;
	int moved, rc;

	for (unsigned i = 0; i < npatches; i++) {
		if (patches[i].target == target) {
			__atomic_store_n(orig, patches[i].orig, __ATOMIC_RELEASE);
			return 0;
		}
	}
	if (npatches == MAX_PATCHES)
		return refuse(why, "table of patches full", -ENOMEM);
	rc = find_mapping(t, &m);
	if (rc == -EINVAL || (!rc && (m.prot & (PROT_READ | PROT_EXEC)) != (PROT_READ | PROT_EXEC)))
		return refuse(why, "target not in readable executable memory", -EINVAL);
	if (rc)
		return refuse(why, "cannot read /proc/self/maps", rc);
	avail = m.end - t < sizeof(code) ? m.end - t : sizeof(code);
	memcpy(code, target, avail);
	if (jump_at(t, code, avail, &j)) {
		if (j.dest == t)
			return refuse(why,
				      "the entry jumps to itself: another patcher is writing it "
				      "(UCX's bistro?)",
				      -EBUSY);
		if (j.chain)
			return install_chain(a, target, code, &m, &j, hook, orig, why);
	}
	if (a->short_dest && !(flags & GDR_PATCH_NO_SHORT)) {
		const char *short_why = NULL;

		rc = install_short(a, target, code, avail, &m, hook, orig, &short_why);
		/* no trampoline memory: the five-byte form needs it as well */
		if (!rc || rc == -ENOTSUP || rc == -EACCES || rc == -EBUSY ||
		    short_why == NO_TRAMPOLINE)
			return rc ? refuse(why, short_why, rc) : 0;
		if (!(flags & GDR_PATCH_QUIESCENT))
			return install_stopped(a, target, code, avail, &m, hook, orig, flags,
					       short_why == SHORT_OUTSIDE
						       ? "one-byte jump's stub address past the "
							 "top (no ASLR: setarch -R, gdb)"
						       : "one-byte jump's stub address taken",
					       why);
	} else if (!a->entry_is_one_insn && !(flags & GDR_PATCH_QUIESCENT)) {
		return install_stopped(a, target, code, avail, &m, hook, orig, flags,
				       "multi-instruction rewrite", why);
	}
	moved = decode(a, code, avail, why);
	if (moved < 0)
		return moved;
	if (a->can_store(target))
		return refuse(why, "entry straddles what one atomic store can write", -EINVAL);

	slot = slot_write(a, target, code, moved, hook, page);
	if (!slot)
		return refuse(why, NO_TRAMPOLINE, -ENOMEM);

	return commit(a, target, code, &m, slot, orig, a->entry_len, why);
}

int gdr_patch_install(void *target, void *hook, void **orig, unsigned flags, const char **why)
{
	const struct gdr_patch_arch *a = gdr_patch_arch();
	int rc;

	if (!a)
		return refuse(why, "no patcher for this architecture", -ENOTSUP);
	if (!target || !hook || !orig)
		return refuse(why, "target, hook or orig NULL", -EINVAL);
	pthread_mutex_lock(&patch_lock);
	rc = install_locked(a, target, hook, orig, flags, why);
	pthread_mutex_unlock(&patch_lock);
	return rc;
}

bool gdr_patch_stopped(const void *fn)
{
	unsigned n = __atomic_load_n(&npatches, __ATOMIC_ACQUIRE);

	for (unsigned i = 0; fn && i < n; i++)
		if (patches[i].target == fn)
			return patches[i].stopped;
	return false;
}

unsigned gdr_patch_bytes(const void *fn)
{
	unsigned n = __atomic_load_n(&npatches, __ATOMIC_ACQUIRE);

	for (unsigned i = 0; fn && i < n; i++)
		if (patches[i].target == fn)
			return patches[i].bytes;
	return 0;
}

bool gdr_patch_is_patched(const void *fn)
{
	unsigned n = __atomic_load_n(&npatches, __ATOMIC_ACQUIRE);

	for (unsigned i = 0; fn && i < n; i++)
		if (patches[i].target == fn)
			return true;
	return false;
}

/* gdr_patch_foreign's text (under patch_lock while written). */
static char foreign_text[160];

/* The base name of an object's path ("" for none). */
static const char *base_name(const char *path)
{
	const char *b = path ? strrchr(path, '/') : NULL;

	return b ? b + 1 : path ? path : "";
}

/* Whether addr is readable for len bytes in one mapping. */
static bool readable(uintptr_t addr, size_t len)
{
	struct mapping m;

	return !find_mapping(addr, &m) && (m.prot & PROT_READ) && addr + len <= m.end;
}

int gdr_patch_foreign(const void *fn, const char **who)
{
	uintptr_t t = (uintptr_t)fn;
	uint8_t code[GDR_PATCH_MAX_MOVED];
	struct mapping m;
	struct jump j;
	Dl_info fi, di;
	bool known;
	size_t avail;
	int rc = 0;

	if (!fn || gdr_patch_is_patched(fn)) /* ours is not foreign */
		return 0;
	pthread_mutex_lock(&patch_lock);
	if (find_mapping(t, &m) || !(m.prot & PROT_READ))
		goto out;
	avail = m.end - t < sizeof(code) ? m.end - t : sizeof(code);
	memcpy(code, fn, avail);
	if (!jump_at(t, code, avail, &j))
		goto out;
	if (j.ptr) {
		if (!readable(j.ptr, sizeof(j.dest)))
			goto out; /* not a jump that could run */
		memcpy(&j.dest, (const void *)j.ptr, sizeof(j.dest));
	}
	if (j.dest == t) {
		snprintf(foreign_text, sizeof(foreign_text),
			 "a %s to itself (another patcher is writing the entry: UCX's bistro?)",
			 j.form);
		rc = 1;
		goto out;
	}
	known = dladdr((const void *)j.dest, &di);
	if (known && dladdr(fn, &fi) && fi.dli_fbase == di.dli_fbase)
		goto out; /* a jump inside its own object */
	if (known && di.dli_fname && *base_name(di.dli_fname))
		snprintf(foreign_text, sizeof(foreign_text),
			 "a %s into %s (another tool's patch: UCX's bistro?)", j.form,
			 base_name(di.dli_fname));
	else
		snprintf(foreign_text, sizeof(foreign_text),
			 "a %s to %#lx (another tool's patch: UCX's bistro?)", j.form,
			 (unsigned long)j.dest);
	rc = 1;
out:
	pthread_mutex_unlock(&patch_lock);
	if (rc && who)
		*who = foreign_text;
	return rc;
}
