/* SPDX-License-Identifier: MIT */
/*
 * libibverbs' data beside the relocation slot the preload writes (issue 31 #5). Run over the fake
 * libibverbs of fakeverbs_relro/, linked -z now (its slot of ibv_reg_mr_iova2 in RELRO), whose
 * constructor left its RELRO pages writable, as the loader leaves the segment's last page where it
 * also holds .data (64 KiB pages: SIMULATED on this 4 KiB-page machine). The preload, which points
 * that slot at itself before main, must give each page back the protection it had: writable. The
 * old code made the slot's page read-only, and a write to libibverbs' data there faulted.
 * Exit 0 pass, 1 fail, 77 skip (no RELRO in the libibverbs loaded).
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

struct seg {
	uintptr_t start, end;
};

static int find(struct dl_phdr_info *info, size_t size, void *data)
{
	struct seg *s = data;

	(void)size;
	if (!info->dlpi_name || !strstr(info->dlpi_name, "libibverbs.so"))
		return 0;
	for (unsigned i = 0; i < info->dlpi_phnum; i++) {
		if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
			s->start = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
			s->end = s->start + info->dlpi_phdr[i].p_memsz;
		}
	}
	return 1;
}

/* Whether /proc/self/maps says the mapping holding a is writable (-1: not found). */
static int writable(uintptr_t a)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512], perm[8];
	unsigned long lo, hi;
	int w = -1;

	if (!f)
		return -1;
	while (w < 0 && fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) == 3 && a >= lo && a < hi)
			w = perm[1] == 'w';
	}
	fclose(f);
	return w;
}

int main(void)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	struct seg s = { 0, 0 };
	int n = 0, bad = 0;
	struct ibv_device **l;

	dl_iterate_phdr(find, &s);
	if (!s.end) {
		printf("SKIP: the libibverbs loaded has no RELRO segment\n");
		return 77;
	}
	for (uintptr_t p = s.start & ~(page - 1); p < s.end; p += page, n++) {
		int w = writable(p);

		if (w != 1) {
			printf("FAIL: libibverbs' RELRO page %#lx is %s after the preload's start\n",
			       (unsigned long)p, w ? "not found" : "read-only");
			bad++;
		}
	}
	/* A write where libibverbs' data would be: the same value back (it is its GOT here). */
	*(volatile uintptr_t *)(s.end - sizeof(uintptr_t)) =
		*(volatile uintptr_t *)(s.end - sizeof(uintptr_t));
	l = ibv_get_device_list(NULL); /* and the verbs still work */
	if (!l) {
		printf("FAIL: ibv_get_device_list\n");
		return 1;
	}
	ibv_free_device_list(l);
	if (!bad)
		printf("ok: libibverbs' %d RELRO page(s) still writable, written\n", n);
	return bad ? 1 : 0;
}
