/* SPDX-License-Identifier: MIT */
#ifndef GDR_BENCH_MACHINE_H
#define GDR_BENCH_MACHINE_H
#include <stddef.h>
/* The CPU's model name ("?" when unknown). */
void bench_cpu_model(char *out, size_t len);
#endif
