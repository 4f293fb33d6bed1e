/* SPDX-License-Identifier: MIT */
/*
 * In the VM: the library's kmod backend end to end, on Debian's kernel with gdrcache.ko, the
 * simulated NVIDIA provider (nvp2p_sim.ko) and soft-RoCE. The fake libcuda declares its memory to
 * the provider (FAKE_CUDA_P2P_SIM), so a free in the fake driver fires the real module's free
 * callback. Proves: pin through the module with an MR on rxe, hit, the revocation of a freed
 * buffer seen by the library through the module's shared page without a CUDA query, a fresh pin,
 * eviction and retry on BAR exhaustion injected in the provider, and no pin left at the end.
 * TAP output; exit 0 all passed, 1 a failure, 77 when the modules or rxe are absent.
 */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "fake_cuda.h"
#include "gdrcache.h"
#include "nvp2p_sim_uapi.h"

static int passed, failed;

#define OK(cond, ...)                                                                   \
	do {                                                                            \
		int ok_ = !!(cond);                                                     \
		ok_ ? passed++ : failed++;                                              \
		printf("%sok %d - ", ok_ ? "" : "not ", passed + failed);               \
		printf(__VA_ARGS__);                                                    \
		printf("%s\n", ok_ ? "" : "  <-- " #cond);                              \
	} while (0)

#define MiB (1024ULL * 1024)

static struct nvp2p_sim_stats sim_stats(int fd)
{
	struct nvp2p_sim_stats s = { 0 };

	ioctl(fd, NVP2P_SIM_IOCTL_GET_STATS, &s);
	return s;
}

static struct gdr_cache_stats stats(struct gdr_cache *c)
{
	struct gdr_cache_stats s;

	gdr_cache_get_stats(c, &s);
	return s;
}

int main(void)
{
	struct ibv_device **devs = ibv_get_device_list(NULL);
	struct gdr_cache_attr attr = { .field_mask = GDR_CACHE_ATTR_BACKEND | GDR_CACHE_ATTR_MAX_ENTRIES,
				       .backend = GDR_BACKEND_KMOD, .max_entries = 64 };
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct gdr_cache *c;
	struct gdr_region *r, *r2;
	struct ibv_mr *mr;
	uint64_t a, b, handle, pages[64], calls;
	uint32_t psize, pcount, lkey, rkey;
	int sim = open(NVP2P_SIM_DEVICE, O_RDWR);

	if (sim < 0 || access("/dev/gdrcache", R_OK) || !devs || !devs[0] || !getenv("FAKE_CUDA_P2P_SIM")) {
		printf("SKIP: needs /dev/nvp2p_sim, /dev/gdrcache, an RDMA device and FAKE_CUDA_P2P_SIM\n");
		return 77;
	}
	ctx = ibv_open_device(devs[0]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	OK(pd != NULL, "PD on %s", ibv_get_device_name(devs[0]));
	OK(gdr_cache_create(&attr, &c) == 0, "cache with the kmod backend over /dev/gdrcache");

	a = fake_cuda_alloc(4 * MiB);
	OK(a && fake_cuda_sim_id(a) != 0, "4 MiB of fake GPU memory declared to the provider");
	memset((void *)(uintptr_t)a, 0x5a, 4 * MiB);
	OK(gdr_reg(c, pd, (void *)(uintptr_t)(a + 4096), 8192,
		   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, &r) == 0,
	   "gdr_reg with a PD: pinned by gdrcache.ko, MR on rxe");
	OK(gdr_region_kmod(r, &handle, &psize, &pcount) == 0 && psize == 65536 && pcount == 64,
	   "module handle %#" PRIx64 ", %u pages of %u bytes (the whole allocation)", handle, pcount,
	   psize);
	OK(gdr_region_pages(r, pages, 64) == 64 && pages[0] != 0, "page list from GET_PAGES");
	OK(gdr_region_mr(r, &mr) == 0 && mr && gdr_region_keys(r, &lkey, &rkey) == 0 &&
	   mr->lkey == lkey, "MR lkey %#x rkey %#x", lkey, rkey);
	OK(sim_stats(sim).outstanding_pins == 1, "the provider holds one pin");
	gdr_dereg(r);
	OK(gdr_reg(c, pd, (void *)(uintptr_t)a, 4 * MiB, IBV_ACCESS_LOCAL_WRITE |
		   IBV_ACCESS_REMOTE_WRITE, &r) == 0 && stats(c).hits == 1 && stats(c).pins == 1,
	   "second registration is a hit");
	gdr_dereg(r);

	/* Free in the fake driver: the provider fires gdrcache.ko's free callback, which marks the
	 * handle in the shared page. The next registration sees it without asking CUDA. */
	fake_cuda_free(a);
	OK(sim_stats(sim).outstanding_pins == 0, "the free callback released the pin in the provider");
	b = fake_cuda_alloc(4 * MiB);
	OK(b == a, "new allocation at the same VA");
	calls = fake_cuda_calls("cuPointerGetAttribute");
	OK(gdr_reg(c, pd, (void *)(uintptr_t)b, 4096, IBV_ACCESS_LOCAL_WRITE, &r) == 0,
	   "gdr_reg of the new buffer");
	OK(fake_cuda_calls("cuPointerGetAttribute") == calls && stats(c).revoked == 1 &&
	   stats(c).stale == 1, "the revocation was seen through the module's page, no BUFFER_ID query");
	OK(gdr_region_kmod(r, &handle, NULL, NULL) == 0 && stats(c).pins == 2, "re-pinned afresh");
	gdr_dereg(r);

	/* BAR exhaustion in the provider: the library evicts and retries. */
	{
		struct nvp2p_sim_fault f = { .type = NVP2P_SIM_FAULT_ENOMEM_AFTER, .value = 2 };
		uint64_t x = fake_cuda_alloc(4 * MiB), y = fake_cuda_alloc(4 * MiB);
		int rc1, rc2;

		ioctl(sim, NVP2P_SIM_IOCTL_SET_FAULT, &f);
		rc1 = gdr_reg(c, NULL, (void *)(uintptr_t)x, 4096, 0, &r);
		if (!rc1)
			gdr_dereg(r);
		rc2 = gdr_reg(c, NULL, (void *)(uintptr_t)y, 4096, 0, &r2);
		OK(!rc1 && !rc2 && stats(c).fail_pin_retried >= 1 && stats(c).evictions >= 1,
		   "ENOMEM from nvidia_p2p_get_pages: evicted and retried (%" PRIu64 " retries)",
		   stats(c).fail_pin_retried);
		if (!rc2)
			gdr_dereg(r2);
		f.type = NVP2P_SIM_FAULT_NONE;
		ioctl(sim, NVP2P_SIM_IOCTL_SET_FAULT, &f);
		fake_cuda_free(x);
		fake_cuda_free(y);
	}

	OK(gdr_cache_destroy(c) == 0, "destroy");
	fake_cuda_free(b);
	OK(sim_stats(sim).outstanding_pins == 0 && sim_stats(sim).outstanding_persistent == 0,
	   "no pin left in the provider");
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(devs);
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
