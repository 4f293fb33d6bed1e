// SPDX-License-Identifier: MIT
/*
 * kmod_tail_check KO [FUNCTION]: issue 31 #12, in the object code. NVIDIA calls gdrcache's free
 * callback (FUNCTION, default gdr_free_callback) holding no reference on the module; the callback
 * takes one for its own run and drops it last. If it drops it with a call, the module's code runs
 * again after module_put() returns (the epilogue and the return), and an rmmod that got in between
 * (the callback's task preempted in module_put()) frees that code under it. Dropped by a tail
 * jump, module_put() returns straight to NVIDIA: nothing of the module runs once the reference is
 * gone (what module_put_and_kthread_exit() does for a kernel thread).
 *
 * Reads the module's ELF file (in the VM, /lib/modules/extra/gdrcache.ko), finds every relocation
 * to module_put inside FUNCTION and looks at the instruction it belongs to: pass if each is a jmp
 * (e9) and there is at least one, fail on any call (e8). x86-64 only: elsewhere exit 77.
 */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kmod_test.h"

static unsigned char *load(const char *path, size_t *len)
{
	unsigned char *buf = NULL;
	FILE *f = fopen(path, "rb");
	long n;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) > 0 && fseek(f, 0, SEEK_SET) == 0) {
		buf = malloc(n);
		if (buf && fread(buf, 1, n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		}
		*len = n;
	}
	fclose(f);
	return buf;
}

int main(int argc, char **argv)
{
	const char *func = argc > 2 ? argv[2] : "gdr_free_callback";
	size_t len = 0, i, j, nsym, nrel;
	int calls = 0, jmps = 0, other = 0;
	const Elf64_Shdr *sh, *symtab = NULL;
	const Elf64_Sym *syms, *fn = NULL;
	const Elf64_Ehdr *eh;
	const char *strtab;
	unsigned long put_idx = 0;
	unsigned char *img;

	if (argc < 2) {
		fprintf(stderr, "usage: %s KO [FUNCTION]\n", argv[0]);
		return 2;
	}
	img = load(argv[1], &len);
	if (!img || len < sizeof(*eh)) {
		printf("1..0 # SKIP cannot read %s\n", argv[1]);
		return KT_SKIP;
	}
	eh = (const Elf64_Ehdr *)img;
	if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
	    eh->e_machine != EM_X86_64) {
		printf("1..0 # SKIP %s is not an x86-64 ELF object: the check reads x86 opcodes\n",
		       argv[1]);
		return KT_SKIP;
	}
	sh = (const Elf64_Shdr *)(img + eh->e_shoff);
	for (i = 0; i < eh->e_shnum; i++)
		if (sh[i].sh_type == SHT_SYMTAB)
			symtab = &sh[i];
	if (!kt_check(symtab != NULL, "%s has a symbol table", argv[1]))
		return kt_done();
	syms = (const Elf64_Sym *)(img + symtab->sh_offset);
	nsym = symtab->sh_size / sizeof(*syms);
	strtab = (const char *)(img + sh[symtab->sh_link].sh_offset);
	for (i = 0; i < nsym; i++) {
		const char *name = strtab + syms[i].st_name;

		if (!strcmp(name, func) && ELF64_ST_TYPE(syms[i].st_info) == STT_FUNC)
			fn = &syms[i];
		else if (!strcmp(name, "module_put"))
			put_idx = i;
	}
	if (!kt_check(fn != NULL && put_idx, "%s defines %s and imports module_put", argv[1], func))
		return kt_done();
	for (i = 0; i < eh->e_shnum; i++) {
		const Elf64_Rela *rel = (const Elf64_Rela *)(img + sh[i].sh_offset);
		const unsigned char *text = img + sh[fn->st_shndx].sh_offset;

		if (sh[i].sh_type != SHT_RELA || sh[i].sh_info != fn->st_shndx)
			continue;
		nrel = sh[i].sh_size / sizeof(*rel);
		for (j = 0; j < nrel; j++) {
			Elf64_Addr off = rel[j].r_offset;

			if (ELF64_R_SYM(rel[j].r_info) != put_idx || off < fn->st_value + 1 ||
			    off >= fn->st_value + fn->st_size)
				continue;
			switch (text[off - 1]) {
			case 0xe8:
				calls++;
				kt_diag("%s+0x%lx: call module_put: the module's code runs after it",
					func, (unsigned long)(off - 1 - fn->st_value));
				break;
			case 0xe9:
				jmps++;
				kt_diag("%s+0x%lx: jmp module_put (tail call)", func,
					(unsigned long)(off - 1 - fn->st_value));
				break;
			default:
				other++;
				kt_diag("%s+0x%lx: opcode 0x%02x before a module_put relocation", func,
					(unsigned long)(off - 1 - fn->st_value), text[off - 1]);
			}
		}
	}
	kt_check(jmps > 0 && !calls && !other,
		 "%s drops its module reference only by tail jumps to module_put (%d jmp, %d call, "
		 "%d other)", func, jmps, calls, other);
	free(img);
	return kt_done();
}
