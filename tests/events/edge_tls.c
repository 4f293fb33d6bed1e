/* SPDX-License-Identifier: MIT */
/*
 * libgdrcache uses initial-exec TLS (the hooks' depth, the lookups' per-thread slots), so a dlopen
 * of it (a plugin, a Python extension: one of the ways the library is loaded) must find its whole
 * TLS block in the static TLS surplus glibc reserves at start-up for ALL such libraries together
 * (about 1.5 KiB on glibc 2.36: glibc's dl-tls.c sizes it assuming each library other than libc
 * needs at most OTHER_IE_TLS = 144 bytes). A larger block makes the dlopen fail with "cannot
 * allocate memory in static TLS block" as soon as other libraries have taken their share.
 *
 * Proves: (1) libgdrcache's TLS block stays within that 144-byte share; (2) after a library that
 * took most of the surplus (1200 bytes, built at test time), libgdrcache still dlopens.
 * argv[1]: libgdrcache; argv[2]: a library with 1200 bytes of initial-exec TLS (edge_tls_hog).
 * Exit 0 pass, 1 fail.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

#define OTHER_IE_TLS 144

static const char *want;
static size_t tls_size = (size_t)-1;

static int phdr(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size, (void)arg;
	if (!info->dlpi_name || !strstr(info->dlpi_name, want))
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++)
		if (info->dlpi_phdr[i].p_type == PT_TLS)
			tls_size = info->dlpi_phdr[i].p_memsz;
	if (tls_size == (size_t)-1)
		tls_size = 0;
	return 1;
}

int main(int argc, char **argv)
{
	const char *base;
	void *hog, *g;

	if (argc < 3)
		return fprintf(stderr, "usage: edge_tls LIBGDRCACHE TLS_HOG\n"), 1;
	hog = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
	if (!hog)
		return fprintf(stderr, "SKIP: %s\n", dlerror()), 77;
	g = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!g) {
		fprintf(stderr,
			"FAIL: dlopen of libgdrcache after another library's static TLS: %s\n",
			dlerror());
		return 1;
	}
	base = strrchr(argv[1], '/');
	want = base ? base + 1 : argv[1];
	dl_iterate_phdr(phdr, NULL);
	printf("libgdrcache's TLS block: %zu bytes (glibc's share per library: %d)\n", tls_size,
	       OTHER_IE_TLS);
	if (tls_size == (size_t)-1)
		return fprintf(stderr, "FAIL: libgdrcache not found among the loaded objects\n"), 1;
	if (tls_size > OTHER_IE_TLS)
		return fprintf(stderr,
			       "FAIL: libgdrcache's static TLS is larger than glibc's share "
			       "per library\n"),
		       1;
	return 0;
}
