/* SPDX-License-Identifier: MIT */
/*
 * bench_hit's output: the machine line, the tables it prints and the CSV rows beside them. The
 * figures come in a struct hit_results, measured by bench_hit.c; nothing here measures.
 */
#ifndef HIT_REPORT_H
#define HIT_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "hit_pattern.h"
#include "hit_sys.h"

#define HIT_LEN 4096
#define BUF_SIZE MiB
#define NPAT 5 /* same, rand128, rand1024, rand4096, mixed1024 */
#define NTP 4  /* own, shared, own-rand, shared-rand */

extern const char *const pat_name[NPAT];
extern const char *const tp_name[NTP];

struct hit_results {
	int counts[8], ncounts; /* thread counts of the throughput runs */
	/* [system][threads index][own/shared/own-rand/shared-rand] */
	double tput[SYS_COUNT][8][NTP];
	double lat[SYS_COUNT][NPAT], lat_best[SYS_COUNT][NPAT];
	double p50[SYS_COUNT][NPAT], p99[SYS_COUNT][NPAT];
	double floor[2][NPAT], floor_best[2][NPAT], harness;
	double miss_us[SYS_COUNT], miss_paired[SYS_COUNT];
	int miss_paired_n[SYS_COUNT];
	double q_us, q9_us, s_us, x_us; /* the miss's parts */
	uint64_t errors[SYS_COUNT];
};

struct trace_result {
	uint64_t requests, misses, wrong, not_covered, failed, reallocs_same_va, frees;
	uint64_t peak_pinned; /* bytes pinned at most, sampled after every registration */
	double us_per_req;
	char stats[512];
};

extern long ncpu;

void report_machine(void);
int report_csv_open(const char *path);
void report_csv_close(void);

void report_header(double secs, int reps, double ns_per_cycle, double timer_cycles);
void report_system(const char *name, const struct sys *s);
void report_latency(const struct hit_results *R, const struct sys *sys, bool quick,
		    double timer_cycles);
void report_floors(const struct hit_results *R);
void report_miss(const struct hit_results *R, const struct sys *sys, int nm);
void report_throughput(const struct hit_results *R, const struct sys *sys);
void report_ratios(const struct hit_results *R, const struct sys *sys);
void report_after(const char *name, struct sys *s, uint64_t errors);
void report_trace_head(const struct trace *t);
void report_trace_row(const struct trace *t, enum sys_kind k, const struct trace_result *r);
void report_trace_unavailable(enum sys_kind k, const struct trace_result *r);
void report_trace_note(void);

#endif
