/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * Control ABI of nvp2p_sim.ko, the test-only simulated NVIDIA P2P provider (tests/kmod/).
 * SIMULATION: it stands in for the NVIDIA driver, which no machine here can load beside gdrcache.ko.
 *
 * "GPU memory" is ordinary anonymous user memory that the fake libcuda (tests/fake/) maps and then
 * declares to the provider with ALLOC: the provider pins its pages (so soft-RoCE can register the same
 * VA) and serves nvidia_p2p_get_pages() on it with 64 KiB pages. FREE (or closing the control file,
 * or the owning process exiting) fires the free callbacks of all callback-mode pins overlapping the
 * allocation synchronously, as the real driver does inside cuMemFree; persistent pins keep the pages
 * alive until nvidia_p2p_put_pages_persistent. Return codes, callback timing and the persistent API
 * follow NVIDIA's nv-p2p.c (535): nvp2p_sim.c says which path mirrors what.
 */
#ifndef NVP2P_SIM_UAPI_H
#define NVP2P_SIM_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define NVP2P_SIM_DEVICE "/dev/nvp2p_sim"

/* va and len multiples of 64 KiB; [va, va+len) must be mapped, writable memory of the caller. */
struct nvp2p_sim_alloc {
	__u64 va;       /* in */
	__u64 len;      /* in */
	__u64 id;       /* out: allocation id, never 0 */
	__u64 reserved; /* in: 0 */
};

struct nvp2p_sim_free {
	__u64 id;       /* in */
	__u64 reserved; /* in: 0 */
};

/* Fault injection; each SET_FAULT replaces the previous setting of that type. */
struct nvp2p_sim_fault {
	__u32 type;     /* NVP2P_SIM_FAULT_* */
	__u32 reserved; /* 0 */
	__u64 value;
};
#define NVP2P_SIM_FAULT_NONE            0 /* clear all faults */
#define NVP2P_SIM_FAULT_ENOMEM_AFTER    1 /* get_pages fails -ENOMEM once value pins are outstanding (BAR exhaustion); 0 = off */
#define NVP2P_SIM_FAULT_EIO_NEXT        2 /* the next value get_pages calls fail with -EIO */
#define NVP2P_SIM_FAULT_CALLBACK_DELAY  3 /* sleep value microseconds inside each free callback dispatch */
#define NVP2P_SIM_FAULT_PUT_ENOMEM      4 /* the next value put_pages / put_pages_persistent calls fail with -ENOMEM
					   * and change nothing, as the open driver's do when it cannot allocate its stack */
#define NVP2P_SIM_FAULT_GET_DELAY       5 /* get_pages sleeps value microseconds after arming the free callback and
					   * before returning: a FREE meanwhile calls back before the client has the table */
#define NVP2P_SIM_FAULT_GET_ERR         6 /* the next get_pages / get_pages_persistent fails with -value, one of the
					   * codes NVIDIA's nvidia_p2p_map_status() returns: EINVAL, ENOMEM, EIO,
					   * ENOTSUPP (524), EBUSY, ENODEV; 0 = off */
#define NVP2P_SIM_FAULT_PUT_GATE        7 /* value 1: every put_pages waits at a closed gate, before anything else,
					   * until value 0 (or FAULT_NONE) opens it, 30 s at most; stats.put_gated
					   * counts the calls waiting there (a test holds one put_pages in flight) */

struct nvp2p_sim_stats {
	__u64 outstanding_pins;        /* callback-mode page tables not yet put or freed */
	__u64 outstanding_persistent;  /* persistent page tables not yet put */
	__u64 allocations;             /* live allocations */
	__u64 callbacks_fired;         /* free callbacks called since load */
	__u64 total_pins;              /* successful get_pages since load */
	__u64 put_gated;               /* put_pages calls waiting at the closed gate now (FAULT_PUT_GATE) */
	__u64 reserved[2];
};

#define NVP2P_SIM_IOCTL_MAGIC 0xDD
#define NVP2P_SIM_IOCTL_ALLOC     _IOWR(NVP2P_SIM_IOCTL_MAGIC, 0x00, struct nvp2p_sim_alloc)
#define NVP2P_SIM_IOCTL_FREE      _IOW(NVP2P_SIM_IOCTL_MAGIC, 0x01, struct nvp2p_sim_free)
#define NVP2P_SIM_IOCTL_SET_FAULT _IOW(NVP2P_SIM_IOCTL_MAGIC, 0x02, struct nvp2p_sim_fault)
#define NVP2P_SIM_IOCTL_GET_STATS _IOR(NVP2P_SIM_IOCTL_MAGIC, 0x03, struct nvp2p_sim_stats)

#endif /* NVP2P_SIM_UAPI_H */
