// SPDX-License-Identifier: MIT
/*
 * kmod_orphan_bench [N]: figures for issue 31 #9, not a test (it prints, it does not judge).
 *
 * A process pins N single pages (N/4096 files) and unmaps its files' anchors; a process sharing
 * its descriptor table (clone(CLONE_FILES)) closes them, so all N pins become orphans of the
 * first. Meanwhile another process times GET_VERSION on its own file: before the orphans exist,
 * while they exist, and while their owner puts them back (its ioctls, until none is left).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kmod_test.h"

#define PER_FILE 4096
#define MAX_FILES 64

static int gfds[MAX_FILES], nfiles;

static double now_us(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static long long orphans(void)
{
	return kt_read_num("/sys/module/gdrcache/parameters/orphans");
}

static int closer(void *arg)
{
	int i;

	(void)arg;
	for (i = 0; i < nfiles; i++)
		close(gfds[i]);
	return 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Median and max of n GET_VERSION calls on fd, in microseconds. */
static void time_version(int fd, int n, double *med, double *max)
{
	struct gdrcache_version v;
	double *t = calloc(n, sizeof(*t));
	int i;

	for (i = 0; i < n; i++) {
		double t0 = now_us();

		kt_gdr_version(fd, &v);
		t[i] = now_us() - t0;
	}
	qsort(t, n, sizeof(*t), cmp);
	*med = t[n / 2];
	*max = t[n - 1];
	free(t);
}

static volatile int draining;
static double drain_max;
static long drain_calls;

static void *victim_during_drain(void *arg)
{
	struct gdrcache_version v;
	int fd = *(int *)arg;

	while (draining) {
		double t0 = now_us(), dt;

		kt_gdr_version(fd, &v);
		dt = now_us() - t0;
		if (dt > drain_max)
			drain_max = dt;
		drain_calls++;
	}
	return NULL;
}

int main(int argc, char **argv)
{
	static char stack[64 * 1024] __attribute__((aligned(16)));
	int n = argc > 1 ? atoi(argv[1]) : 16384, i, go[2], ready[2], status, vfd;
	double med0, max0, med1, max1;
	char c;
	pid_t owner;

	kt_require_devices();
	setvbuf(stdout, NULL, _IOLBF, 0);
	nfiles = (n + PER_FILE - 1) / PER_FILE;
	if (nfiles > MAX_FILES || pipe(go) || pipe(ready))
		return 2;
	vfd = kt_gdr_open();
	time_version(vfd, 200, &med0, &max0);
	printf("# victim GET_VERSION, no orphans: median %.1f us, max %.1f us\n", med0, max0);

	owner = fork();
	if (owner == 0) {
		char *buf = kt_gpu_mem(KT_GPU_PAGE);
		int s = kt_sim_open(), made = 0, f;
		struct gdrcache_version v;
		double t0, first, total;
		uint64_t id;
		pid_t p;

		if (kt_sim_alloc(s, buf, KT_GPU_PAGE, &id))
			_exit(1);
		for (f = 0; f < nfiles; f++)
			gfds[f] = kt_gdr_open();
		for (i = 0; i < n; i++)
			made += !kt_gdr_pin(gfds[i / PER_FILE], (uintptr_t)buf, KT_GPU_PAGE, 0, NULL);
		kt_gdr_drop_anchors();
		p = clone(closer, stack + sizeof(stack), CLONE_FILES | SIGCHLD, NULL);
		waitpid(p, NULL, 0);
		printf("# owner: %d pins made, %lld orphans after its sibling's close\n", made,
		       orphans());
		if (write(ready[1], "r", 1) != 1 || read(go[0], &c, 1) != 1)
			_exit(2);
		/* Its own calls put them back: a fresh file to call on. */
		f = kt_gdr_open();
		t0 = now_us();
		kt_gdr_version(f, &v);
		first = now_us() - t0;
		i = 1;
		while (orphans() > 0 && i < 1000000) {
			kt_gdr_version(f, &v);
			i++;
		}
		total = now_us() - t0;
		printf("# owner: first GET_VERSION %.1f us; %d calls, %.1f ms until no orphan left\n",
		       first, i, total / 1e3);
		_exit(0);
	}
	if (read(ready[0], &c, 1) != 1)
		return 2;
	time_version(vfd, 200, &med1, &max1);
	printf("# victim GET_VERSION, %lld orphans of another process: median %.1f us, max %.1f us "
	       "(x%.0f)\n", orphans(), med1, max1, med1 / med0);
	{
		pthread_t th;

		draining = 1;
		pthread_create(&th, NULL, victim_during_drain, &vfd);
		if (write(go[1], "g", 1) != 1)
			return 2;
		waitpid(owner, &status, 0);
		draining = 0;
		pthread_join(th, NULL);
	}
	printf("# victim GET_VERSION while the owner put them back: %ld calls, max %.1f us\n",
	       drain_calls, drain_max);
	close(vfd);
	printf("1..0 # figures only\n");
	return 0;
}
