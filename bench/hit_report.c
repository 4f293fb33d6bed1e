/* SPDX-License-Identifier: MIT */
/*
 * bench_hit's output (hit_report.h): the tables it prints and the CSV rows beside them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hit_cuda.h"
#include "hit_report.h"
#include "machine.h"

const char *const pat_name[NPAT] = { "same", "rand128", "rand1024", "rand4096", "mixed1024" };
const char *const tp_name[NTP] = { "own", "shared", "own-rand", "shared-rand" };

static char cpu_model[128] = "?";
long ncpu;
static FILE *csv;

void report_machine(void)
{
	bench_cpu_model(cpu_model, sizeof(cpu_model));
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
}

/* One CSV row: the machine, then what was measured. */
static void row(const char *metric, const char *system, const char *trace, int threads,
		const char *buffers, double value, const char *unit)
{
	if (!csv)
		return;
	fprintf(csv, "\"%s\",%s,%d,%ld,%s,%s,%s,%d,%s,%.6g,%s\n", hc.gpu, hc.driver,
		hc.cuda_version, ncpu, metric, system, trace ? trace : "", threads,
		buffers ? buffers : "", value, unit);
}

int report_csv_open(const char *path)
{
	csv = fopen(path, "w");
	if (!csv) {
		perror(path);
		return -1;
	}
	fprintf(csv, "gpu,driver,cuda,cpus,metric,system,trace,threads,buffers,value,unit\n");
	return 0;
}

void report_csv_close(void)
{
	if (csv)
		fclose(csv);
}

void report_header(double secs, int reps, double ns_per_cycle, double timer_cycles)
{
	printf("# bench_hit: registration-cache hits side by side, one run\n");
	printf("# libgdrcache loaded: %s\n",
	       getenv("BENCH_LOAD_MODE") ? getenv("BENCH_LOAD_MODE")
	       : getenv("LD_PRELOAD") && strstr(getenv("LD_PRELOAD"), "gdrcache")
		       ? "linked into the executable, and LD_PRELOADed"
		       : "linked into the executable");
	printf("# machine: GPU 0 %s; NVIDIA driver %s; CUDA driver API %d; %ld CPUs (%s)\n", hc.gpu,
	       hc.driver, hc.cuda_version, ncpu, cpu_model);
	if (hc.fake)
		printf("# THE FAKE CUDA DRIVER ($GDRCACHE_LIBCUDA): a simulation, not a measurement\n");
	printf("# registrations of %llu KiB at the start of %llu MiB buffers (same), or at a random "
	       "4 KiB page of a random buffer of a set (rand*, mixed*); %.2f s per point, median of "
	       "%d; threads pinned to CPUs 0..n-1; cycle counter %.3f ns, timer %.0f cycles\n",
	       HIT_LEN / KiB, BUF_SIZE / MiB, secs, reps, ns_per_cycle, timer_cycles);
}

void report_system(const char *name, const struct sys *s)
{
	printf("  %-11s %s%s\n", name, s->available ? "" : "UNAVAILABLE: ", s->why);
}

void report_latency(const struct hit_results *R, const struct sys *sys, bool quick,
		    double timer_cycles)
{
	printf("\nlatency, one thread, ns per registration + release of a cached range: mean of a "
	       "timed loop (median of %d runs, the systems taking turns; best), and p50 / p99 of %d "
	       "hits timed one by one:\n",
	       quick ? 3 : 7, quick ? 20000 : 200000);
	printf("  %-11s", "system");
	for (int pi = 0; pi < NPAT; pi++)
		printf(" %26s", pat_name[pi]);
	printf("\n");
	for (int k = 0; k < SYS_COUNT; k++) {
		if (!sys[k].available)
			continue;
		printf("  %-11s", sys_names[k]);
		for (int pi = 0; pi < NPAT; pi++) {
			char cell[64];

			snprintf(cell, sizeof(cell), "%.1f (%.1f) %.0f/%.0f", R->lat[k][pi],
				 R->lat_best[k][pi], R->p50[k][pi], R->p99[k][pi]);
			printf(" %26s", cell);
			row("hit_latency", sys_names[k], NULL, 1, pat_name[pi], R->lat[k][pi],
			    "ns");
			row("hit_latency_best", sys_names[k], NULL, 1, pat_name[pi],
			    R->lat_best[k][pi], "ns");
			row("hit_latency_p50", sys_names[k], NULL, 1, pat_name[pi], R->p50[k][pi],
			    "ns");
			row("hit_latency_p99", sys_names[k], NULL, 1, pat_name[pi], R->p99[k][pi],
			    "ns");
		}
		printf("\n");
	}
	printf("  (cell: mean (best) p50/p99; p50/p99 less the timer's %.0f cycles)\n",
	       timer_cycles);
}

void report_floors(const struct hit_results *R)
{
	for (int fl = 0; fl < 2; fl++) {
		static const char *const fl_name[2] = { "floor", "floor-1line" };

		printf("  %-11s", fl_name[fl]);
		for (int pi = 0; pi < NPAT; pi++) {
			char cell[64] = "-";

			if (pi >= 1 && pi <= 3) { /* the random sets of 1 MiB buffers */
				snprintf(cell, sizeof(cell), "%.1f (%.1f)", R->floor[fl][pi],
					 R->floor_best[fl][pi]);
				row("hit_latency_floor", fl_name[fl], NULL, 1, pat_name[pi],
				    R->floor[fl][pi], "ns");
			}
			printf(" %26s", cell);
		}
		printf("\n");
	}
	printf("  (floor: the least a lock-free hit does, on the same buffers and addresses: a "
	       "hash of the 2 MiB granule, the 64-byte record its slot names, a thread's count up "
	       "and down; floor-1line: the same with the records in the hash's slots, one random "
	       "line a hit)\n");
	printf("  harness alone (a random address made and its set read, no registration): "
	       "%.1f ns (rand4096)\n",
	       R->harness);
}

void report_miss(const struct hit_results *R, const struct sys *sys, int nm)
{
	printf("\nmiss, first registration of a new %llu MiB allocation (median of %d, the systems "
	       "taking turns on each, each first in turn):\n",
	       BUF_SIZE / MiB, nm);
	for (int k = 0; k < SYS_COUNT; k++)
		if (sys[k].available) {
			printf("  %-11s %8.1f us", sys_names[k], R->miss_us[k]);
			if (sys[SYS_TAGCHECK].available && k != SYS_TAGCHECK) {
				printf("   (%+.1f us against tagcheck; median of %d paired "
				       "differences %+.2f us)",
				       R->miss_us[k] - R->miss_us[SYS_TAGCHECK],
				       R->miss_paired_n[k], R->miss_paired[k]);
				row("miss_vs_tagcheck", sys_names[k], NULL, 1, "paired",
				    R->miss_paired[k], "us");
			}
			printf("\n");
			row("miss", sys_names[k], NULL, 1, "new", R->miss_us[k], "us");
		}
	printf("  its parts, timed alone on fresh allocations: query %.2f us, first SYNC_MEMOPS "
	       "%.2f us, dma-buf export %.2f us (sum %.2f us); libgdrcache's query of 9 "
	       "attributes %.2f us (%+.2f us)\n",
	       R->q_us, R->s_us, R->x_us, R->q_us + R->s_us + R->x_us, R->q9_us,
	       R->q9_us - R->q_us);
	row("miss_part", "driver", NULL, 1, "query9", R->q9_us, "us");
	for (int k = 0; k < SYS_COUNT; k++)
		if (sys[k].available)
			printf("  %-11s own work (miss less the parts): %.2f us\n", sys_names[k],
			       R->miss_us[k] - (R->q_us + R->s_us + R->x_us));
	row("miss_part", "driver", NULL, 1, "query", R->q_us, "us");
	row("miss_part", "driver", NULL, 1, "sync_memops", R->s_us, "us");
	row("miss_part", "driver", NULL, 1, "dmabuf_export", R->x_us, "us");
}

void report_throughput(const struct hit_results *R, const struct sys *sys)
{
	for (int m = 0; m < 4; m++) {
		static const char *const what[4] = {
			"own buffer per thread", "one buffer shared by all threads",
			"each thread a random one of its own 128 buffers, random 4 KiB page",
			"all threads a random one of 2048 shared buffers, random 4 KiB page"
		};

		printf("\nhit throughput, %s, aggregate M hits/s (ns per hit per thread):\n",
		       what[m]);
		printf("  %-8s", "threads");
		for (int k = 0; k < SYS_COUNT; k++)
			if (sys[k].available)
				printf(" %24s", sys_names[k]);
		printf("\n");
		for (int ti = 0; ti < R->ncounts; ti++) {
			printf("  %-8d", R->counts[ti]);
			for (int k = 0; k < SYS_COUNT; k++) {
				double r = R->tput[k][ti][m];

				if (!sys[k].available)
					continue;
				printf(" %12.2f (%7.1f ns)", r / 1e6,
				       r > 0 ? R->counts[ti] / r * 1e9 : 0);
				row("hit_throughput", sys_names[k], NULL, R->counts[ti], tp_name[m],
				    r / 1e6, "Mops");
			}
			printf("\n");
		}
	}
}

void report_ratios(const struct hit_results *R, const struct sys *sys)
{
	/* Ratios the issues' goals are stated in. */
	printf("\nratios (same run):\n");
	for (int k = SYS_GDR_EVENTS; k <= SYS_GDR_TAG; k++) {
		int last = R->ncounts - 1;

		if (!sys[k].available) {
			printf("  %-11s unavailable: %s\n", sys_names[k], sys[k].why);
			continue;
		}
		printf("  %-11s 1-thread hit, same buffer %.1f ns (goal <= 15 ns); random of 128 / "
		       "1024 / 4096 %.1f / %.1f / %.1f ns, mixed sizes %.1f ns (goal <= 20 ns)\n",
		       sys_names[k], R->lat[k][0], R->lat[k][1], R->lat[k][2], R->lat[k][3],
		       R->lat[k][4]);
		printf("  %-11s %d threads: own random %.1f M hits/s (goal >= 300), shared random "
		       "%.1f M hits/s: own / shared = %.2f (goal <= 1.5)\n",
		       sys_names[k], R->counts[last], R->tput[k][last][2] / 1e6,
		       R->tput[k][last][3] / 1e6,
		       R->tput[k][last][3] > 0 ? R->tput[k][last][2] / R->tput[k][last][3] : 0);
		if (sys[SYS_TAGCHECK].available)
			for (int m = 0; m < 4; m++) {
				double b = R->tput[SYS_TAGCHECK][last][m];
				double q = b > 0 ? R->tput[k][last][m] / b : 0;

				printf("  %-11s %d threads, %s: %.1f x tagcheck\n", sys_names[k],
				       R->counts[last], tp_name[m], q);
				row("ratio_vs_tagcheck", sys_names[k], NULL, R->counts[last],
				    tp_name[m], q, "x");
			}
		if (sys[SYS_UCS].available) {
			for (int m = 0; m < 4; m++) {
				printf("  %-11s vs ucs-rcache, %-11s (threads:ratio):",
				       sys_names[k], tp_name[m]);
				for (int ti = 0; ti < R->ncounts; ti++) {
					double b = R->tput[SYS_UCS][ti][m];
					double q = b > 0 ? R->tput[k][ti][m] / b : 0;

					printf(" %d:%.2fx", R->counts[ti], q);
					row("ratio_vs_ucs", sys_names[k], NULL, R->counts[ti],
					    tp_name[m], q, "x");
				}
				printf("\n");
			}
			if (R->lat[SYS_UCS][0] > 0)
				printf("  %-11s 1-thread latency vs ucs-rcache: %.2f x faster (same), "
				       "%.2f x (rand1024)\n",
				       sys_names[k], R->lat[SYS_UCS][0] / R->lat[k][0],
				       R->lat[SYS_UCS][2] / R->lat[k][2]);
		}
	}
	/* Issue 16 item 4: the preload's hit within 2 x the library's, scaling with threads. */
	if (sys[SYS_PRELOAD].available && sys[SYS_GDR_EVENTS].available) {
		int last = R->ncounts - 1;

		printf("  %-11s 1-thread hit over gdr-events':", "preload");
		for (int pi = 0; pi < NPAT; pi++)
			printf(" %s %.2f x%s", pat_name[pi],
			       R->lat[SYS_PRELOAD][pi] / R->lat[SYS_GDR_EVENTS][pi],
			       pi + 1 < NPAT ? "," : " (goal <= 2)\n");
		printf("  %-11s %d threads: own random %.1f M hits/s (%.2f x gdr-events'), shared "
		       "random %.1f M hits/s (%.2f x)\n",
		       "preload", R->counts[last], R->tput[SYS_PRELOAD][last][2] / 1e6,
		       R->tput[SYS_PRELOAD][last][2] / R->tput[SYS_GDR_EVENTS][last][2],
		       R->tput[SYS_PRELOAD][last][3] / 1e6,
		       R->tput[SYS_PRELOAD][last][3] / R->tput[SYS_GDR_EVENTS][last][3]);
	}
}

void report_after(const char *name, struct sys *s, uint64_t errors)
{
	char d[512];

	sys_describe(s, d, sizeof(d));
	printf("  %-11s after the hit runs: %s; failed registrations %" PRIu64 "\n", name, d,
	       errors);
}

void report_trace_head(const struct trace *t)
{
	if (t->lim.max_bytes)
		printf("\ntrace %s: %s; cache limit %" PRIu64 " MiB, %" PRIu64 " entries\n",
		       t->name, t->what, (uint64_t)(t->lim.max_bytes / MiB), t->lim.max_entries);
	else
		printf("\ntrace %s: %s; libgdrcache's default limits (its info line "
		       "says what they resolve to), the others unbounded\n",
		       t->name, t->what);
	printf("  %-11s %9s %8s %9s %8s %6s %6s %8s %10s %9s\n", "system", "requests", "misses",
	       "hit rate", "us/req", "stale", "short", "failed", "same-VA", "peak MiB");
}

void report_trace_row(const struct trace *t, enum sys_kind k, const struct trace_result *r)
{
	const char *name = sys_names[k];

	printf("  %-11s %9" PRIu64 " %8" PRIu64 " %8.2f%% %8.2f %6" PRIu64 " %6" PRIu64 " %8" PRIu64
	       " %10" PRIu64 " %9" PRIu64 "\n",
	       name, r->requests, r->misses,
	       r->requests ? 100.0 * (1.0 - (double)r->misses / r->requests) : 0, r->us_per_req,
	       r->wrong, r->not_covered, r->failed, r->reallocs_same_va, r->peak_pinned >> 20);
	row("trace_peak_pinned", name, t->name, 1, "", (double)(r->peak_pinned >> 20), "MiB");
	printf("  %-11s   %s\n", "", r->stats);
	row("trace_hit_rate", name, t->name, 1, "",
	    r->requests ? 1.0 - (double)r->misses / r->requests : 0, "fraction");
	row("trace_requests", name, t->name, 1, "", r->requests, "count");
	row("trace_misses", name, t->name, 1, "", r->misses, "count");
	row("trace_us_per_request", name, t->name, 1, "", r->us_per_req, "us");
	row("trace_stale_handed_out", name, t->name, 1, "", r->wrong, "count");
	row("trace_not_covered", name, t->name, 1, "", r->not_covered, "count");
	row("trace_failed", name, t->name, 1, "", r->failed, "count");
	row("trace_realloc_same_va", name, t->name, 1, "", r->reallocs_same_va, "count");
}

void report_trace_note(void)
{
	printf("\n(stale: registrations whose BUFFER_ID is not the address's current one, "
	       "checked outside the timed call; short: range not covering the request; "
	       "same-VA: allocations that came back at a VA registered before its free; "
	       "peak MiB: bytes pinned at most, against the limit)\n");
}

void report_trace_unavailable(enum sys_kind k, const struct trace_result *r)
{
	printf("  %-11s unavailable: %s\n", sys_names[k], r->stats);
}
