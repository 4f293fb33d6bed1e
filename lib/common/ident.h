/* SPDX-License-Identifier: MIT */
/* Who writes a log line or a statistics record: host, MPI rank, and the cache the thread is working
 * for (ident.c). Read once, with the configuration: nothing here reads the environment later. */
#ifndef GDR_COMMON_IDENT_H
#define GDR_COMMON_IDENT_H

#include <stdint.h>

struct gdr_ident {
	char host[72];        /* uname(2)'s node name, [A-Za-z0-9._-] kept, others '_' */
	int rank;             /* the launcher's rank of this process; -1: none */
	const char *rank_var; /* the variable it came from, NULL: none */
};
/* Reads the launchers' rank variables (OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK, SLURM_PROCID: the
 * first that holds a decimal number) and the host name. Called once, first, by config.c's read of
 * the environment (under its pthread_once). */
void gdr_ident_init(void);
/* The identity once gdr_ident_init ran, else NULL (log.c's lines before the configuration). */
const struct gdr_ident *gdr_ident(void);

/* The id of the cache (struct gdr_cache's id: 1, 2, ... in the process) on whose behalf this thread
 * works now, 0 for none: log lines made meanwhile say "cache=N". Set with _enter and put back
 * with _leave (nesting: the inner one wins until it leaves). */
extern __thread uint64_t gdr_ident_cache __attribute__((tls_model("initial-exec")));
static inline uint64_t gdr_ident_cache_enter(uint64_t id)
{
	uint64_t old = gdr_ident_cache;

	gdr_ident_cache = id;
	return old;
}

static inline void gdr_ident_cache_leave(uint64_t old)
{
	gdr_ident_cache = old;
}

#endif /* GDR_COMMON_IDENT_H */
