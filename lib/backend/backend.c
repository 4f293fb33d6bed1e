/* SPDX-License-Identifier: MIT */
/* Backend choice: the configured one, or for "auto" the first that opens, with the reason logged. */
#include <errno.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "common/config.h"
#include "common/log.h"

static const struct gdr_backend_ops *const by_id[] = {
	[GDR_BACKEND_KMOD] = &gdr_backend_kmod_ops,
	[GDR_BACKEND_DMABUF] = &gdr_backend_dmabuf_ops,
	[GDR_BACKEND_PEERMEM] = &gdr_backend_peermem_ops,
};

/* What "auto" tries, best first. */
static const enum gdr_backend auto_order[] = { GDR_BACKEND_KMOD, GDR_BACKEND_DMABUF,
					       GDR_BACKEND_PEERMEM };

int gdr_backend_select(const struct gdr_config *cfg, const struct gdr_sys *sys, struct gdr_be **b)
{
	const char *why = "";
	int rc;

	if (cfg->backend != GDR_BACKEND_AUTO) {
		const struct gdr_backend_ops *ops = by_id[cfg->backend];

		rc = ops->open(cfg, sys, b, &why);
		if (rc)
			gdr_err("backend %s (asked for) is unavailable: %s", ops->name, why);
		else
			gdr_info("backend %s: asked for", ops->name);
		return rc;
	}
	for (size_t i = 0; i < sizeof(auto_order) / sizeof(auto_order[0]); i++) {
		const struct gdr_backend_ops *ops = by_id[auto_order[i]];

		rc = ops->open(cfg, sys, b, &why);
		if (!rc) {
			gdr_info("backend %s chosen automatically: %s", ops->name, why);
			return 0;
		}
		gdr_info("backend %s not usable: %s", ops->name, why);
	}
	return -ENODEV;
}

int gdr_backend_for_device(const struct gdr_config *cfg, const struct gdr_be *primary, int device,
			   struct gdr_be **b)
{
	const char *why = "";
	bool after = false;

	if (cfg->backend != GDR_BACKEND_AUTO)
		return -EOPNOTSUPP;
	for (size_t i = 0; i < sizeof(auto_order) / sizeof(auto_order[0]); i++) {
		const struct gdr_backend_ops *ops = by_id[auto_order[i]];

		if (ops == primary->ops) {
			after = true;
			continue;
		}
		if (!after || ops->open(cfg, &primary->sys, b, &why))
			continue;
		if (!ops->serves || ops->serves(*b, device, &why)) {
			gdr_info("backend %s chosen for CUDA device %d, which %s does not serve",
				 ops->name, device, primary->ops->name);
			return 0;
		}
		ops->close(*b);
		gdr_info("backend %s does not serve CUDA device %d either: %s", ops->name, device,
			 why);
	}
	return -EOPNOTSUPP;
}

int gdr_backend_no_pages(struct gdr_be *b, const struct gdr_pin *pin, uint64_t *pages, uint32_t max)
{
	(void)b, (void)pin, (void)pages, (void)max;
	return -ENOENT;
}

int gdr_backend_alloc(const struct gdr_backend_ops *ops, const struct gdr_sys *sys,
		      struct gdr_be **out, const char **why)
{
	struct gdr_be *b = calloc(1, sizeof(*b));

	if (!b) {
		*why = "out of memory";
		return -ENOMEM;
	}
	b->ops = ops;
	b->sys = *sys;
	*out = b;
	return 0;
}

void gdr_backend_free(struct gdr_be *b)
{
	free(b);
}
