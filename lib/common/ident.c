/* SPDX-License-Identifier: MIT */
/*
 * The process's identity in logs and statistics records: the host name and the MPI rank, read once
 * with the configuration (config.c), so that neither a log line nor the statistics thread reads
 * the environment while the program may be rebuilding it (log.c). The pid is asked of getpid() at
 * each use: a child of fork() has its own. The rank is the first of the launchers' variables
 * that holds a decimal number: Open MPI's, PMIx's (Open MPI 5, PRRTE), MPICH's and Cray PALS'
 * PMI, then Slurm's (last: mpirun inside an allocation may leave the batch step's there).
 */
#define _GNU_SOURCE
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

#include "common/ident.h"

__thread uint64_t gdr_ident_cache __attribute__((tls_model("initial-exec")));

static struct gdr_ident ident = { .rank = -1 };
static bool ready; /* __atomic: log.c reads ident from any thread once set */

static const char *const rank_vars[] = {
	"OMPI_COMM_WORLD_RANK",
	"PMIX_RANK",
	"PMI_RANK",
	"SLURM_PROCID",
};

/* A rank: decimal digits only, at most INT_MAX; else -1. */
static int parse_rank(const char *s)
{
	long long v = 0;

	if (!s || !*s)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (*s - '0');
		if (v > INT_MAX)
			return -1;
	}
	return (int)v;
}

void gdr_ident_init(void)
{
	struct utsname u;
	size_t n = 0;

	if (__atomic_load_n(&ready, __ATOMIC_ACQUIRE))
		return;
	if (!uname(&u))
		for (const char *p = u.nodename; *p && n < sizeof(ident.host) - 1; p++, n++)
			ident.host[n] =
				(*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
						(*p >= '0' && *p <= '9') || *p == '.' ||
						*p == '-' || *p == '_'
					? *p
					: '_'; /* a name fit for a path, a kv value, a log line */
	if (!n)
		strcpy(ident.host, "unknown");
	else
		ident.host[n] = '\0';
	for (size_t i = 0; i < sizeof(rank_vars) / sizeof(rank_vars[0]); i++) {
		int r = parse_rank(getenv(rank_vars[i]));

		if (r >= 0) {
			ident.rank = r;
			ident.rank_var = rank_vars[i];
			break;
		}
	}
	__atomic_store_n(&ready, true, __ATOMIC_RELEASE);
}

const struct gdr_ident *gdr_ident(void)
{
	return __atomic_load_n(&ready, __ATOMIC_ACQUIRE) ? &ident : NULL;
}
