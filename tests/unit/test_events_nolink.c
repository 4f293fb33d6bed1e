/* SPDX-License-Identifier: MIT */
/*
 * A program that links neither libcuda nor libgdrcache (an unmodified verbs program) run under
 * LD_PRELOAD=libgdrcache-preload.so: the preload's dlsym leads to libgdrcache's free interception
 * (lib/preload/dlsym.c), so the start-up probe must pass. Exits 77 when not run under the preload.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>

int main(void)
{
	int (*probe)(const char **) = (int (*)(const char **))dlsym(RTLD_DEFAULT,
								    "gdr_private_events_probe");
	const char *why = "";
	int rc;

	if (!probe) {
		printf("libgdrcache is not loaded: run under LD_PRELOAD=libgdrcache-preload.so\n");
		return 77;
	}
	rc = probe(&why);
	printf("probe under the preload library: %d (%s)\n", rc, why);
	return rc ? 1 : 0;
}
