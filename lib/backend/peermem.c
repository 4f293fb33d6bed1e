/* SPDX-License-Identifier: MIT */
/*
 * Backend "peermem": for systems with nvidia-peermem loaded, where ibv_reg_mr on a GPU VA makes the
 * NIC driver pin it through NVIDIA's peer-memory client. There is no pin apart from an MR, so this
 * backend needs a PD for every registration (gdr_reg without one: -EOPNOTSUPP).
 */
#include <errno.h>

#include "backend/backend.h"
#include "common/config.h"
#include "nic/verbs.h"

static int peermem_open(const struct gdr_config *cfg, const struct gdr_sys *sys,
			struct gdr_be **out, const char **why)
{
	(void)cfg;
	if (gdr_backend_alloc(&gdr_backend_peermem_ops, sys, out, why))
		return -ENOMEM;
	*why = "ibv_reg_mr on GPU addresses (needs nvidia-peermem)";
	return 0;
}

/* The MR is the pin: nothing to do until one is asked for. */
static int peermem_pin(struct gdr_be *b, struct gdr_pin *pin)
{
	(void)b, (void)pin;
	return 0;
}

static void peermem_unpin(struct gdr_be *b, struct gdr_pin *pin)
{
	(void)b, (void)pin;
}

static int peermem_reg_mr(struct gdr_be *b, const struct gdr_pin *pin, struct ibv_pd *pd,
			  int access, uint64_t base, uint64_t len, struct ibv_mr **mr)
{
	(void)pin;
	return gdr_verbs_reg(b->sys.verbs, pd, (void *)(uintptr_t)base, len, base, access, mr);
}

const struct gdr_backend_ops gdr_backend_peermem_ops = {
	.name = "peermem",
	.id = GDR_BACKEND_PEERMEM,
	.open = peermem_open,
	.close = gdr_backend_free,
	.pin = peermem_pin,
	.unpin = peermem_unpin,
	.reg_mr = peermem_reg_mr,
	.pages = gdr_backend_no_pages,
	.pins_without_pd = false,
};
