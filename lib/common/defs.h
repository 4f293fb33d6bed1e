/* SPDX-License-Identifier: MIT */
/* What every file of the library shares: symbol visibility and the sizes the cache is built around. */
#ifndef GDR_COMMON_DEFS_H
#define GDR_COMMON_DEFS_H

#include <errno.h>
#include <stdint.h>

#include "gdrcache.h"

#define GDR_EXPORT __attribute__((visibility("default")))
#define GDR_GPU_PAGE (64ULL * 1024)
#define GDR_ALIGN_DOWN(x) ((x) & ~(GDR_GPU_PAGE - 1))
#define GDR_ALIGN_UP(x) (((x) + GDR_GPU_PAGE - 1) & ~(GDR_GPU_PAGE - 1))
/* ibv_access_flags that let a remote peer reach the memory: REMOTE_WRITE, _READ, _ATOMIC, MW_BIND
 * (a window can be bound anywhere in its MR), FLUSH_GLOBAL and FLUSH_PERSISTENT (1 << 8 and 9,
 * rdma-core 45 and later: a peer's flush of the MR). Such registrations get an MR of exactly their
 * range, unless the caller asks for the wide one (GDR_ACCESS_WIDE_MR). */
#define GDR_IBV_ACCESS_REMOTE (0x2 | 0x4 | 0x8 | 0x10 | 0x100 | 0x200)
/* IBV_ACCESS_ZERO_BASED: the MR is addressed by offsets from the start of its own range, which a
 * shared MR of the whole pin does not begin at: such registrations always get an MR of exactly
 * their range, GDR_ACCESS_WIDE_MR or not. */
#define GDR_IBV_ACCESS_ZERO_BASED 0x20
/* Exact (remote-access) records an entry keeps before it is replaced, unless most are held
 * (gdr_entry_exact_full); and at most, held or not. */
#define GDR_EXACT_PER_ENTRY 32
#define GDR_EXACT_MAX 16384
/* Most CUDA allocations one registration may span (a request over several cuMemMap'ed chunks). */
#define GDR_MAX_TAGS 64
#define GDR_MAX_DEVICES 64 /* CUDA devices a cache tells apart */
#define GDR_HIDDEN __attribute__((visibility("hidden")))

/* The header's promise: no public function changes errno. Declared at the start of a public entry
 * point's slow path (never on the lock-free hit path), it restores errno however the scope is left:
 * libc, libibverbs, gdrcache.ko's system calls and the CUDA driver may all set it. */
static inline void gdr_errno_restore(const int *saved)
{
	errno = *saved;
}
#define GDR_KEEP_ERRNO()                                                                           \
	int gdr_errno_saved_ __attribute__((cleanup(gdr_errno_restore), unused)) = errno

#endif /* GDR_COMMON_DEFS_H */
