/* SPDX-License-Identifier: MIT */
/*
 * Backend "dmabuf": the upstream-kernel path. The pin is a dma-buf exported by the CUDA driver
 * (cuMemGetHandleForAddressRange(DMA_BUF_FD)); with a PD, ibv_reg_dmabuf_mr imports it. The open
 * dma-buf keeps the GPU memory alive, so a freed buffer's entry must be dropped (its fd closed)
 * promptly: the validator drops it at the next lookup that touches it, eviction or flush otherwise.
 */
#include <errno.h>
#include <unistd.h>

#include "backend/backend.h"
#include "common/config.h"
#include "common/log.h"
#include "cuda/cuda.h"
#include "cuda/cuda_abi.h"
#include "intercept/hooks.h" /* gdr_driver_load */
#include "nic/verbs.h"

static bool exports_dmabufs(int device)
{
	int supported = 0;

	return !gdr_cuda_device_attr(device, GDR_CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
				     &supported) &&
	       supported;
}

/* Opens when some GPU exports dma-bufs; a GPU that does not is served by another backend
 * (serves, and gdr_backend_for_device). */
static int dmabuf_open(const struct gdr_config *cfg, const struct gdr_sys *sys, struct gdr_be **out,
		       const char **why)
{
	int n = gdr_cuda_device_count(), d;

	(void)cfg;
	if (gdr_driver_load()) {
		*why = "no CUDA driver";
		return -ENODEV;
	}
	for (d = 0; d < n && !exports_dmabufs(d); d++)
		;
	if (d >= n) {
		*why = "no GPU exports dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)";
		return -ENODEV;
	}
	if (gdr_backend_alloc(&gdr_backend_dmabuf_ops, sys, out, why))
		return -ENOMEM;
	*why = d == 0 ? "GPU 0 exports dma-bufs" : "a GPU exports dma-bufs (not GPU 0)";
	return 0;
}

static int dmabuf_serves(struct gdr_be *b, int device, const char **why)
{
	(void)b;
	if (exports_dmabufs(device))
		return 1;
	*why = "the GPU does not export dma-bufs (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 0)";
	return 0;
}

static int dmabuf_pin(struct gdr_be *b, struct gdr_pin *pin)
{
	int fd, rc;

	(void)b;
	rc = gdr_cuda_dmabuf_export(pin->base, pin->len, pin->device, &fd);
	if (rc)
		return rc;
	pin->has_dmabuf = true;
	pin->dmabuf_fd = fd; /* exported for exactly the pin: offset 0 is its base */
	gdr_dbg("dmabuf_export range=%#llx-%#llx dev=%d fd=%d", (unsigned long long)pin->base,
		(unsigned long long)(pin->base + pin->len), pin->device, fd);
	return 0;
}

static void dmabuf_unpin(struct gdr_be *b, struct gdr_pin *pin)
{
	(void)b;
	if (pin->has_dmabuf && close(pin->dmabuf_fd))
		gdr_err("close of dma-buf fd %d failed", pin->dmabuf_fd);
	pin->has_dmabuf = false;
	pin->dmabuf_fd = -1;
}

static int dmabuf_reg_mr(struct gdr_be *b, const struct gdr_pin *pin, struct ibv_pd *pd, int access,
			 uint64_t base, uint64_t len, struct ibv_mr **mr)
{
	(void)b;
	return gdr_verbs_reg_dmabuf(b->sys.verbs, pd, base - pin->base, len, base, pin->dmabuf_fd,
				    access, mr);
}

const struct gdr_backend_ops gdr_backend_dmabuf_ops = {
	.name = "dmabuf",
	.id = GDR_BACKEND_DMABUF,
	.open = dmabuf_open,
	.close = gdr_backend_free,
	.pin = dmabuf_pin,
	.unpin = dmabuf_unpin,
	.reg_mr = dmabuf_reg_mr,
	.pages = gdr_backend_no_pages,
	.serves = dmabuf_serves,
	.pins_without_pd = true,
	.pool_by_chunk = true,
};
