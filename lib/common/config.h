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
	int log_level;
	bool stats;
	char kmod_dev[256];
	char libcuda[256];
	const char *bad;           /* the first malformed variable's name: caches are refused */
};
/* The environment, parsed once. A malformed value is logged (naming the variable and the form it
 * must take) and recorded in ->bad: gdr_cache_create then fails with -EINVAL. Unknown GDRCACHE_*
 * names are warned about once. */
const struct gdr_config *gdr_config_get(void);
/* fn for every variable of the table: its name, the form it takes, its effective value and its
 * default as text, and whether the environment sets it (gdrcache_info). */
void gdr_config_each(void (*fn)(const char *name, const char *form, const char *value,
				const char *dflt, bool set, void *arg), void *arg);
/* Parse a size with optional K/M/G/T suffix. Returns 0 or -EINVAL. */
int gdr_parse_size(const char *s, uint64_t *out);

#endif /* GDR_COMMON_CONFIG_H */
