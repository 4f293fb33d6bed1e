/* SPDX-License-Identifier: MIT */
/* What the GPUs offer to pins (BAR1 and memory), for the cache's default limits. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>

#include "common/defs.h"
#include "cuda/cuda.h"

/* What the GPUs offer to pins: BAR1 (what GPUDirect RDMA maps: nvidia_p2p_get_pages and a NIC's
 * peer-to-peer access to a dma-buf both take BAR1 space) and memory. Found without NVML: the PCI
 * address from cuDeviceGetAttribute, BAR1's size from sysfs (resource, second line), memory from
 * cuDeviceTotalMem_v2. Once per process. */
static struct gdr_cuda_devices dev_facts;

int gdr_cuda_device_pci(int dev, char *pci, size_t n)
{
	int domain = 0, bus = -1, slot = -1;

	if (gdr_cuda_device_attr(dev, 33 /* PCI_BUS_ID */, &bus) ||
	    gdr_cuda_device_attr(dev, 34 /* PCI_DEVICE_ID */, &slot) || bus < 0 || slot < 0)
		return -ENODEV;
	gdr_cuda_device_attr(dev, 50 /* PCI_DOMAIN_ID */, &domain);
	snprintf(pci, n, "%04x:%02x:%02x.0", domain, bus, slot);
	return 0;
}

uint64_t gdr_cuda_pci_bar1(const char *pci, char *path, size_t n)
{
	unsigned long long lo = 0, hi = 0, flags = 0;
	char line[160];
	uint64_t size = 0;
	FILE *f;

	snprintf(path, n, "/sys/bus/pci/devices/%s/resource", pci);
	/* BAR1 is the framebuffer aperture: the largest BAR after BAR0 (which line it is on depends
	 * on whether BAR0 is a 64-bit BAR: on the H100 VM it is, and BAR1 is the third line). */
	f = fopen(path, "re");
	if (f) {
		for (int i = 0; i < 6 && fgets(line, sizeof(line), f); i++)
			if (i && sscanf(line, "%llx %llx %llx", &lo, &hi, &flags) == 3 && hi > lo &&
			    hi - lo + 1 > size)
				size = hi - lo + 1;
		fclose(f);
	}
	return size;
}

static uint64_t bar1_size(int dev)
{
	char pci[32], path[96];
	uint64_t size;

	if (gdr_cuda_device_pci(dev, pci, sizeof(pci)))
		return 0;
	size = gdr_cuda_pci_bar1(pci, path, sizeof(path));
	if (!size && !dev_facts.bar1_miss[0])
		snprintf(dev_facts.bar1_miss, sizeof(dev_facts.bar1_miss), "%s", path);
	return size;
}

/* Per device, not min(sum of BAR1, sum of memory): a 16 GB GPU with 256 MiB of BAR1 beside an 80 GB
 * one with 128 GiB can have 80 GiB + 256 MiB pinned, not 96 GiB. */
void gdr_cuda_devices_add(struct gdr_cuda_devices *f, uint64_t bar1, uint64_t mem)
{
	uint64_t p = bar1 && mem ? (bar1 < mem ? bar1 : mem) : bar1 ? bar1 : mem;

	f->bar1 += bar1;
	f->mem += mem;
	f->pinnable += p;
	if (p && (!f->pinnable_min || p < f->pinnable_min))
		f->pinnable_min = p;
	f->ndev += p != 0;
}

/* No cancellation point acts here (sysfs is read with stdio): a thread cancelled halfway would
 * leave the devices it added counted, and pthread_once would run this again, counting them twice. */
static void devices_init(void)
{
	int (*total_mem)(size_t * bytes, int dev) = NULL;
	void *h = gdr_cuda_libcuda_handle();
	int n = gdr_cuda_device_count(), cancel;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	if (h)
		*(void **)&total_mem = dlsym(h, "cuDeviceTotalMem_v2");
	for (int d = 0; d < n && d < GDR_MAX_DEVICES; d++) {
		uint64_t bar1 = bar1_size(d);
		size_t mem = 0;

		if (total_mem && total_mem(&mem, d) != 0)
			mem = 0;
		gdr_cuda_devices_add(&dev_facts, bar1, mem);
	}
	snprintf(dev_facts.why, sizeof(dev_facts.why),
		 "%d GPU%s: BAR1 %" PRIu64 " MiB%s%s, memory %" PRIu64 " MiB", dev_facts.ndev,
		 dev_facts.ndev == 1 ? "" : "s", dev_facts.bar1 >> 20,
		 dev_facts.bar1_miss[0] ? " (not in " : "", dev_facts.bar1_miss[0] ? "sysfs)" : "",
		 dev_facts.mem >> 20);
	pthread_setcancelstate(cancel, NULL);
}

const struct gdr_cuda_devices *gdr_cuda_devices(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, devices_init);
	return &dev_facts;
}
