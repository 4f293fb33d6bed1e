/* SPDX-License-Identifier: MIT */
/* The GDRCACHE_* environment, parsed once from one table (config.c). */
#ifndef GDR_COMMON_CONFIG_H
#define GDR_COMMON_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

struct gdr_config {
	uint64_t max_bytes;
	uint64_t max_entries;
	uint64_t max_pin_bytes;
	int backend;
	int validate;
	int intercept; /* enum gdr_intercept */
	int log_level;
	bool stats;
	char kmod_dev[256];
	char libcuda[256];
	const char *bad; /* the first malformed variable's name: caches are refused */
};
/* The environment, parsed once. A malformed value is logged (naming the variable and the form it
 * must take) and recorded in ->bad: gdr_cache_create then fails with -EINVAL. Unknown GDRCACHE_*
 * names are warned about once. */
const struct gdr_config *gdr_config_get(void);

/*
 * One row of config.c's table, the only place a variable is named, defaulted and described: the
 * header's environment comment, docs/configuration.md's table and gdrcache(7) follow it (docs/man/mkman.py
 * generates the page's list; tests/packaging/check_config_docs.py checks the other two).
 */
struct gdr_config_var {
	const char *name;
	const char *form; /* the form a value must take (said when one is malformed) */
	const char *dflt; /* the default as documented: a value, or how it is derived */
	const char *desc; /* what it sets, in one line */
	bool test;        /* a test switch: documented in config.c only, listed for no user */
};
/* fn for every variable of the table, test switches included: its row, its effective value as
 * text, and whether the environment sets it (gdrcache_info). */
void gdr_config_vars(void (*fn)(const struct gdr_config_var *var, const char *value, bool set,
				void *arg),
		     void *arg);
/* fn for every user variable (no test switch): its name, form, effective value, the value it has
 * when unset (derived limits: their fixed fallback) and whether the environment sets it. */
void gdr_config_each(void (*fn)(const char *name, const char *form, const char *value,
				const char *dflt, bool set, void *arg),
		     void *arg);

/* The table's test switches, parsed with the rest: they select a code path for a test, and are
 * never for users. */
struct gdr_config_tests {
	bool no_membarrier; /* GDRCACHE_NO_MEMBARRIER: the locked increment on lookups (thread.c) */
};
const struct gdr_config_tests *gdr_config_tests(void);

/* Parse a size with optional K/M/G/T suffix. Returns 0 or -EINVAL. */
int gdr_parse_size(const char *s, uint64_t *out);

#endif /* GDR_COMMON_CONFIG_H */
