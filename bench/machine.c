/* SPDX-License-Identifier: MIT */
/* The CPU the benchmarks ran on, as /proc/cpuinfo names it: every figure is printed with it. */
#include <stdio.h>
#include <string.h>

#include "machine.h"

void bench_cpu_model(char *out, size_t len)
{
	char line[256];
	FILE *f = fopen("/proc/cpuinfo", "r");

	snprintf(out, len, "?");
	while (f && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "model name");

		if (p && (p = strchr(p, ':'))) {
			snprintf(out, len, "%s", p + 2);
			out[strcspn(out, "\n")] = 0;
			break;
		}
	}
	if (f)
		fclose(f);
}
