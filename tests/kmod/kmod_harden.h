/* SPDX-License-Identifier: MIT */
/*
 * What the parts of kmod_harden_test share (kmod_harden_*.c): the provider's device, the run's
 * length, the helpers of kmod_harden_test.c, and each part's subtests (main's table).
 */
#ifndef KMOD_HARDEN_H
#define KMOD_HARDEN_H

#include <stdint.h>
#include <sys/types.h>

#include "kmod_test.h"

#define TEST_GID 4242	/* group given /dev/gdrcache by the tests */
#define USER_A 1000
#define USER_B 1001

extern int sim;		/* /dev/nvp2p_sim */
extern int seconds;	/* how long a timed subtest runs (SECONDS, default 5) */

/* kmod_harden_test.c */
double now(void);
/* A module parameter as a number; -1 if it does not exist. */
long long param(const char *module, const char *name);
/* Write a parameter of gdrcache. */
int set_param_ull(const char *name, unsigned long long v);
/* The provider's counters; exits 2 if they cannot be read. */
void stats(struct nvp2p_sim_stats *s);
/* Wait up to secs for the provider to hold exactly pins + persistent. */
int wait_sim(unsigned long long pins, unsigned long long persistent, double secs);
/* Wait up to secs for gdrcache's orphans parameter to read want. */
int wait_orphans(long long want, double secs);
/* Run fn() in a child under uid (and, if gid, with that supplementary group). */
int as_user(uid_t uid, gid_t gid, int (*fn)(void *), void *arg);
/* Pass n descriptors over a unix socket (SCM_RIGHTS), and receive them. */
int send_fds(int sock, const int *fds, int n);
int recv_fds(int sock, int *fds, int n);

/* kmod_harden_pin.c: PIN against its own races (VM case 23) */
void test_pin_race(void);
void test_pin_revoke(void);
void test_free_table(void);
void test_get_pages_fault(void);
/* kmod_harden_limits.c: lengths, the memory cgroup, access and caps (VM case 24) */
void test_len(void);
void test_memcg(void);
void test_access(void);
/* kmod_harden_put.c: put_pages failing, NVIDIA's put and get codes (VM cases 25, 28) */
void test_put_fail(void);
void test_put_context(void);
void test_get_errors(void);
/* kmod_harden_owner.c: pins do not outlive their owner, who cannot be impersonated (VM case 26) */
void test_owner(void);
void test_identity(void);
/* kmod_harden_orphans.c: issue 31 items 9-11 (VM case 26c) */
void test_orphan_lock(void);
void test_owner_exit_shared(void);
void test_userns_caps(void);
/* Re-executed as "kmod_harden_test identity-exec FD N" by test_identity. */
int identity_exec(const char *self, int fd, int n);

#endif /* KMOD_HARDEN_H */
