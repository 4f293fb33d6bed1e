/* SPDX-License-Identifier: MIT */
/*
 * Our own declarations of NVIDIA's kernel P2P API (the functions the NVIDIA
 * driver exports for GPUDirect RDMA), written from its documented prototypes,
 * structure layouts and version macros. Used when the build is not given a
 * real nv-p2p.h (make NVIDIA_SRC=...), and by the simulated provider in
 * tests/kmod/. The typedefs are NVIDIA's names, kept so that code written
 * against nv-p2p.h builds against this header too.
 */
#ifndef GDRCACHE_NV_P2P_ABI_H
#define GDRCACHE_NV_P2P_ABI_H

#include <linux/types.h>

/*
 * A version is major in the upper 16 bits, minor in the lower 16 bits. NVIDIA's
 * header: a minor bump is a backwards-compatible layout change, a major bump a
 * breaking one ("require at least recompilation"), so a client accepts its own
 * major with a minor at least its own, nothing else.
 */
#define NVIDIA_P2P_MAJOR_VERSION_MASK	0xffff0000
#define NVIDIA_P2P_MINOR_VERSION_MASK	0x0000ffff
#define NVIDIA_P2P_MAJOR_VERSION(v)	(((v) & NVIDIA_P2P_MAJOR_VERSION_MASK) >> 16)
#define NVIDIA_P2P_MINOR_VERSION(v)	((v) & NVIDIA_P2P_MINOR_VERSION_MASK)

/* Same major, and a minor at least the one we were built against. */
#define NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION((p)->version) == NVIDIA_P2P_MAJOR_VERSION(v))
#define NVIDIA_P2P_VERSION_COMPATIBLE(p, v) \
	(NVIDIA_P2P_MAJOR_VERSION_MATCHES(p, v) && \
	 NVIDIA_P2P_MINOR_VERSION((p)->version) >= NVIDIA_P2P_MINOR_VERSION(v))

#define NVIDIA_P2P_GPU_UUID_LEN	16

/* The driver offers nvidia_p2p_get_pages_persistent(). */
#define NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API

enum nvidia_p2p_page_size_type {
	NVIDIA_P2P_PAGE_SIZE_4KB = 0,
	NVIDIA_P2P_PAGE_SIZE_64KB,
	NVIDIA_P2P_PAGE_SIZE_128KB,
	NVIDIA_P2P_PAGE_SIZE_COUNT
};

typedef struct nvidia_p2p_page {
	uint64_t physical_address;
	union nvidia_p2p_request_registers {
		struct {
			uint32_t wreqmb_h;
			uint32_t rreqmb_h;
			uint32_t rreqmb_0;
			uint32_t reserved[3];
		} fermi;
	} registers;
} nvidia_p2p_page_t;

/* 1.2 is the first page table with gpu_uuid, and what current drivers emit. */
#define NVIDIA_P2P_PAGE_TABLE_VERSION	0x00010002
#define NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_PAGE_TABLE_VERSION)

typedef struct nvidia_p2p_page_table {
	uint32_t version;
	uint32_t page_size;		/* enum nvidia_p2p_page_size_type */
	struct nvidia_p2p_page **pages;
	uint32_t entries;
	uint8_t *gpu_uuid;
} nvidia_p2p_page_table_t;

#define NVIDIA_P2P_DMA_MAPPING_VERSION	0x00020003
#define NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(p) \
	NVIDIA_P2P_VERSION_COMPATIBLE(p, NVIDIA_P2P_DMA_MAPPING_VERSION)

struct pci_dev;

typedef struct nvidia_p2p_dma_mapping {
	uint32_t version;
	enum nvidia_p2p_page_size_type page_size_type;
	uint32_t entries;
	uint64_t *dma_addresses;
	void *private;
	struct pci_dev *pci_dev;
} nvidia_p2p_dma_mapping_t;

/* Flags of the persistent calls. */
#define NVIDIA_P2P_FLAGS_DEFAULT		0
#define NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING	1

/*
 * Pin [virtual_address, virtual_address + length) of the GPU VA space named by
 * (p2p_token, va_space) (0, 0: the calling process). Both 64 KiB aligned.
 * free_callback(data) runs when the memory is freed behind our back; it must
 * call nvidia_p2p_free_page_table() and must not call nvidia_p2p_put_pages().
 * May sleep. Returns 0, -EINVAL, -ENOTSUPP, -ENOMEM (BAR exhausted) or -EIO.
 */
int nvidia_p2p_get_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address, uint64_t length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data);

/*
 * Release a callback-mode pin; blocks while its free callback is running. The
 * open driver returns 0 for a page table its callback already took, and
 * -ENOMEM, having done nothing, when it cannot allocate its stack: the page
 * table then stays live and its callback armed.
 */
int nvidia_p2p_put_pages(uint64_t p2p_token, uint32_t va_space,
			 uint64_t virtual_address,
			 struct nvidia_p2p_page_table *page_table);

/* Pin without a free callback: the pages stay until put_pages_persistent. */
int nvidia_p2p_get_pages_persistent(uint64_t virtual_address, uint64_t length,
				    struct nvidia_p2p_page_table **page_table,
				    uint32_t flags);

/* flags must be 0. Fails like put_pages (-ENOMEM: nothing released). */
int nvidia_p2p_put_pages_persistent(uint64_t virtual_address,
				    struct nvidia_p2p_page_table *page_table,
				    uint32_t flags);

/*
 * Called from the free callback only. A no-op in current drivers (the driver
 * frees the table after the callback returns); older ones freed it here, which
 * may sleep: call it with no spinlock held and interrupts on.
 */
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table);

int nvidia_p2p_dma_map_pages(struct pci_dev *peer,
			     struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping);
int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer,
			       struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping);
int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping);

#endif /* GDRCACHE_NV_P2P_ABI_H */
