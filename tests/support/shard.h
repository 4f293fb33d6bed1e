/* SPDX-License-Identifier: MIT */
/* Running part of a cmocka group, so that a slow program can be several ctest entries (each with
 * its own timeout, run in parallel) without a copy of its cases:
 *   GDR_TEST_ONLY=pat[,pat...]  only the cases whose name matches one of the fnmatch patterns;
 *   GDR_TEST_SKIP=pat[,pat...]  not those;
 *   GDR_TEST_SHARD=k/n          of what is left, the k-th of every n (0 <= k < n).
 * cmocka 1.1's own filter takes one pattern and cannot exclude, hence this. A selection that leaves
 * nothing fails (exit 1, saying so), so a misspelt pattern cannot pass by running nothing. */
#ifndef GDR_TEST_SHARD_H
#define GDR_TEST_SHARD_H

#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline int gdr_shard_match(const char *list, const char *name)
{
	char buf[512], *save = NULL;

	snprintf(buf, sizeof(buf), "%s", list);
	for (char *p = strtok_r(buf, ",", &save); p; p = strtok_r(NULL, ",", &save))
		if (fnmatch(p, name, 0) == 0)
			return 1;
	return 0;
}

static inline int gdr_run_tests_sharded(const char *group, const struct CMUnitTest *tests, size_t n)
{
	const char *only = getenv("GDR_TEST_ONLY"), *skip = getenv("GDR_TEST_SKIP");
	const char *shard = getenv("GDR_TEST_SHARD");
	unsigned k = 0, of = 1;
	struct CMUnitTest *sel = calloc(n ? n : 1, sizeof(*sel));
	size_t m = 0, left = 0;
	int rc;

	if (!sel)
		return 1;
	if (shard && *shard && (sscanf(shard, "%u/%u", &k, &of) != 2 || of == 0 || k >= of)) {
		fprintf(stderr, "%s: GDR_TEST_SHARD=%s: want k/n with 0 <= k < n\n", group, shard);
		free(sel);
		return 1;
	}
	for (size_t i = 0; i < n; i++) {
		if (only && *only && !gdr_shard_match(only, tests[i].name))
			continue;
		if (skip && *skip && gdr_shard_match(skip, tests[i].name))
			continue;
		if (left++ % of == k)
			sel[m++] = tests[i];
	}
	if (m == 0) {
		fprintf(stderr, "%s: no case selected (GDR_TEST_ONLY=%s GDR_TEST_SKIP=%s GDR_TEST_SHARD=%s)\n",
			group, only ? only : "", skip ? skip : "", shard ? shard : "");
		free(sel);
		return 1;
	}
	rc = _cmocka_run_group_tests(group, sel, m, NULL, NULL);
	free(sel);
	return rc;
}

#endif /* GDR_TEST_SHARD_H */
