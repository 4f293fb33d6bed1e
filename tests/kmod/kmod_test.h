/* SPDX-License-Identifier: MIT */
/*
 * Helpers shared by the kernel-module test programs (run as root inside the
 * test VM): TAP output, and thin wrappers over /dev/gdrcache and
 * /dev/nvp2p_sim that return 0 or -errno.
 */
#ifndef KMOD_TEST_H
#define KMOD_TEST_H

#include <stddef.h>
#include <stdint.h>

#include <gdrcache/uapi.h>
#include "nvp2p_sim_uapi.h"

#define KT_SKIP 77
#define KT_GPU_PAGE ((size_t)GDRCACHE_PAGE_SIZE)

/* TAP: one "ok N - name" / "not ok N - name" line per check. */
int kt_check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Expect ret (0 or -errno) to equal want. */
int kt_expect(long ret, long want, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void kt_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kt_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print the plan; return the exit status: 0 if every check passed, else 1. */
int kt_done(void);
/* Exit 77 unless both devices exist. */
void kt_require_devices(void);

/* Anonymous memory of len bytes whose start is 64 KiB aligned. */
void *kt_gpu_mem(size_t len);
void kt_gpu_mem_free(void *p, size_t len);

int kt_sim_open(void);
int kt_sim_alloc(int fd, void *va, size_t len, uint64_t *id);
int kt_sim_free(int fd, uint64_t id);
int kt_sim_fault(int fd, uint32_t type, uint64_t value);
int kt_sim_stats(int fd, struct nvp2p_sim_stats *s);
/* Check the provider's outstanding callback pins, persistent pins and allocations. */
int kt_sim_expect(int fd, unsigned long long pins, unsigned long long persistent,
		  unsigned long long allocations, const char *what);
/* Write s to the file at path (sysfs, cgroupfs); 0 or -errno. */
int kt_write_file(const char *path, const char *s);
/* The number the file at path holds; -1 if it cannot be read. */
long long kt_read_num(const char *path);
/* Write a module parameter of nvp2p_sim or gdrcache; 0 or -errno. */
int kt_set_param(const char *module, const char *param, const char *value);
/* The kernel's taint flags (/proc/sys/kernel/tainted); 0 if unreadable. */
unsigned long long kt_taint(void);
/* Read up to n queued revocation events without blocking: how many, or -errno (-EAGAIN: none). */
int kt_read_events(int fd, struct gdrcache_event *ev, size_t n);

int kt_gdr_open(void);
/* munmap() every mapping of /dev/gdrcache in this process (open()'s anchors among them): how
 * many, or -errno. Without its anchor, only the owner's close() ends a file. */
int kt_gdr_drop_anchors(void);
int kt_gdr_version(int fd, struct gdrcache_version *v);
int kt_gdr_pin(int fd, uint64_t va, uint64_t len, uint32_t flags, struct gdrcache_pin *out);
int kt_gdr_unpin(int fd, uint64_t handle);
int kt_gdr_get_pages(int fd, uint64_t handle, uint64_t *pages, uint32_t max, uint32_t *count);

/* 0 or -errno of ioctl(). */
int kt_ioctl(int fd, unsigned long cmd, void *arg);

#endif /* KMOD_TEST_H */
