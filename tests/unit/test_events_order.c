/* SPDX-License-Identifier: MIT */
/*
 * A program linked with libcuda AHEAD of libgdrcache (-lcuda -lgdrcache): its direct calls of
 * cuMemFree_v2 bind to libcuda's own, which libgdrcache never sees. The start-up probe must find
 * this out and fail (the caches then check tags), though the dlsym paths it also checks are
 * wrapped. Runs against the fake driver (tests/fake).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <gdrcache.h>

#include "fake_cuda.h"

int gdr_private_events_probe(const char **why);
uint64_t gdr_private_events_head(void);
int cuMemFree_v2(uint64_t dptr); /* the fake's, bound first */

int main(void)
{
	struct gdr_cache_attr attr = { .field_mask = GDR_CACHE_ATTR_VALIDATE,
				       .validate = GDR_VALIDATE_AUTO };
	struct gdr_cache_stats st;
	struct gdr_cache *c;
	const char *why = "";
	uint64_t head, a;
	int rc, fails = 0;

	rc = gdr_private_events_probe(&why);
	printf("probe: %d (%s)\n", rc, why);
	if (rc == 0 || !strstr(why, "RTLD_DEFAULT")) {
		printf("FAIL: the probe should refuse: direct calls bind to libcuda\n");
		fails++;
	}
	/* What the probe found: a direct call is not seen. */
	a = fake_cuda_alloc(1 << 20);
	head = gdr_private_events_head();
	cuMemFree_v2(a);
	if (gdr_private_events_head() != head) {
		printf("FAIL: a direct cuMemFree_v2 was seen: libcuda is not first after all\n");
		fails++;
	}
	/* And mode auto resolves to tag checks. */
	if (gdr_cache_create(&attr, &c) || gdr_cache_get_stats(c, &st) ||
	    st.validate_mode != GDR_VALIDATE_TAG || gdr_cache_destroy(c)) {
		printf("FAIL: mode auto did not fall back to tag\n");
		fails++;
	}
	attr.validate = GDR_VALIDATE_EVENTS;
	if (gdr_cache_create(&attr, &c) != -EOPNOTSUPP) {
		printf("FAIL: mode events was not refused\n");
		fails++;
	}
	printf("%s\n", fails ? "FAILED" : "ok: linked after libcuda, events refused, tags used");
	return fails ? 1 : 0;
}
