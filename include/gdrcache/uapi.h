/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR MIT */
/*
 * gdrcache.ko ioctl ABI: shared, byte for byte, by kmod/ and lib/backend/kmod.c.
 *
 * Rules of this ABI:
 *  - every struct has fixed-width fields and explicit padding; sizes are multiples of 8;
 *  - every ioctl is encoded with its struct (never a pointer's size);
 *  - unknown flag bits and non-zero reserved fields are rejected with -EINVAL, so the ABI can grow;
 *  - user space calls GDRCACHE_IOCTL_GET_VERSION first and refuses a module whose major differs.
 *
 * One open file belongs to the process image that opened it: another process, or the same process
 * after an execve, gets -EACCES. The owner's close() of any descriptor of the file (a dup()'ed one
 * too), or the owner's exit or execve, releases every pin the file holds, persistent ones included,
 * however many other references remain (a forked child's descriptor, one passed over SCM_RIGHTS, a
 * mapping, a process sharing the owner's descriptor table through clone(CLONE_FILES)): from then on
 * every call on the file fails with -EACCES. The revocation area is not inherited by fork().
 * open() maps one read-only page of the file into the opener (its anchor: the module learns of the
 * owner's exit when that address space goes) and so needs read access (O_WRONLY: -EACCES); the
 * owner's close() unmaps it. An owner that unmaps it itself keeps the rule only where its
 * descriptor table is its own: its exit then closes the file.
 *
 * Invalidation channel (callback-mode pins only; persistent pins are never revoked):
 *  - mmap(NULL, version.revoke_area_size, PROT_READ, MAP_SHARED, fd, 0) maps a read-only
 *    struct gdrcache_revoke_area. When NVIDIA's free callback revokes the pin with handle h, the module
 *    stores h into slot[GDRCACHE_HANDLE_SLOT(h)] and then increments revoke_count (release order),
 *    so a reader that sees a changed revoke_count also sees the slot. slot[i] == h means "h is revoked".
 *    Handles carry a generation, so a slot reused by a later pin never matches an older handle.
 *  - read() returns whole struct gdrcache_event records (EAGAIN with O_NONBLOCK when none);
 *    poll() reports POLLIN while events are queued. If the queue overflows, one event of type
 *    GDRCACHE_EVENT_OVERFLOW is queued and the reader must rescan the mapped area.
 */
#ifndef GDRCACHE_UAPI_H
#define GDRCACHE_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define GDRCACHE_UAPI_VERSION_MAJOR 1
/* Minor 1: the ownership rules above; PIN may return a handle that is already revoked. */
#define GDRCACHE_UAPI_VERSION_MINOR 1

#define GDRCACHE_DEVICE_NAME "gdrcache"          /* /dev/gdrcache */
#define GDRCACHE_PAGE_SHIFT  16                  /* pins are made of 64 KiB GPU pages */
#define GDRCACHE_PAGE_SIZE   (1ULL << GDRCACHE_PAGE_SHIFT)

/* A handle: slot index in the low 32 bits, generation (never 0) in the high 32 bits. */
#define GDRCACHE_HANDLE_SLOT(h) ((__u32)((h) & 0xffffffffULL))
#define GDRCACHE_HANDLE_GEN(h)  ((__u32)((h) >> 32))

/* GDRCACHE_IOCTL_GET_VERSION: all fields are output; reserved must be zero on input. */
struct gdrcache_version {
	__u32 major;             /* GDRCACHE_UAPI_VERSION_MAJOR of the module */
	__u32 minor;
	__u32 features;          /* GDRCACHE_FEAT_* */
	__u32 max_pins;          /* slots in the revocation area = most pins one file may hold */
	__u64 revoke_area_size;  /* bytes to mmap at offset 0 (a multiple of the CPU page size) */
	__u64 reserved[4];
};
#define GDRCACHE_FEAT_PERSISTENT (1U << 0) /* nvidia_p2p_get_pages_persistent is available */
#define GDRCACHE_FEAT_EVENTS     (1U << 1) /* revocation area and read()/poll() events */

/* GDRCACHE_IOCTL_PIN: va and len must be multiples of 64 KiB, 0 < len <= 1 TiB, va + len must not
 * wrap. If the memory is freed while PIN runs, PIN still succeeds and the handle it returns is
 * already revoked (area slot and event published, GET_PAGES -EIO). Caps: -ENOSPC when the file is
 * full or a global cap is reached, -EDQUOT when a per-user cap is (kmod/README.md). */
struct gdrcache_pin {
	__u64 va;                /* in */
	__u64 len;               /* in */
	__u32 flags;             /* in: GDRCACHE_PIN_* */
	__u32 page_size;         /* out: bytes per GPU page (65536) */
	__u64 handle;            /* out */
	__u32 page_count;        /* out */
	__u32 reserved0;         /* in: must be 0 */
	__u8  gpu_uuid[16];      /* out */
	__u64 reserved[4];       /* in: must be 0 */
};
#define GDRCACHE_PIN_PERSISTENT (1U << 0) /* nvidia_p2p_get_pages_persistent: no free callback */
#define GDRCACHE_PIN_FLAGS_ALL  (GDRCACHE_PIN_PERSISTENT)

/* GDRCACHE_IOCTL_UNPIN: unknown or already-unpinned handle: -ENOENT. Unpinning a revoked handle
 * succeeds (it frees the slot; the provider's page table is already gone). */
struct gdrcache_unpin {
	__u64 handle;            /* in */
	__u32 flags;             /* in: must be 0 */
	__u32 reserved0;         /* in: must be 0 */
};

/* GDRCACHE_IOCTL_GET_PAGES: copies up to max_pages physical (bus) addresses of the pinned pages to
 * the user array at pages_ptr; page_count says how many the pin has (even if max_pages is smaller).
 * A revoked handle: -EIO. */
struct gdrcache_get_pages {
	__u64 handle;            /* in */
	__u64 pages_ptr;         /* in: user address of a __u64 array */
	__u32 max_pages;         /* in */
	__u32 page_count;        /* out */
	__u32 page_size;         /* out */
	__u32 flags;             /* in: must be 0 */
	__u64 reserved[2];       /* in: must be 0 */
};

/* The read-only shared area. */
struct gdrcache_revoke_area {
	__u64 revoke_count;      /* incremented after each slot store */
	__u32 nslots;            /* == gdrcache_version.max_pins */
	__u32 reserved0;
	__u64 reserved[6];       /* header is 64 bytes */
	__u64 slot[];            /* slot[i] == handle once that handle is revoked */
};

/* What read() returns. */
struct gdrcache_event {
	__u64 handle;
	__u64 va;
	__u64 len;
	__u32 type;              /* GDRCACHE_EVENT_* */
	__u32 reserved0;
};
#define GDRCACHE_EVENT_REVOKED  1
#define GDRCACHE_EVENT_OVERFLOW 2

#define GDRCACHE_IOCTL_MAGIC 0xDC
#define GDRCACHE_IOCTL_GET_VERSION _IOWR(GDRCACHE_IOCTL_MAGIC, 0x00, struct gdrcache_version)
#define GDRCACHE_IOCTL_PIN         _IOWR(GDRCACHE_IOCTL_MAGIC, 0x01, struct gdrcache_pin)
#define GDRCACHE_IOCTL_UNPIN       _IOW(GDRCACHE_IOCTL_MAGIC, 0x02, struct gdrcache_unpin)
#define GDRCACHE_IOCTL_GET_PAGES   _IOWR(GDRCACHE_IOCTL_MAGIC, 0x03, struct gdrcache_get_pages)

#endif /* GDRCACHE_UAPI_H */
