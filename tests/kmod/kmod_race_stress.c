// SPDX-License-Identifier: MIT
/*
 * kmod_race_stress: free callbacks racing with UNPIN. Pairs of threads share
 * one buffer: each round the "owner" declares it to nvp2p_sim (the same VA
 * every round, as CUDA reuses it), pins it several times (callback mode, plus
 * one persistent pin), then at once the "freer" FREEs the allocation (firing
 * the callbacks, slowed down by an injected delay) while the owner UNPINs and
 * GET_PAGES the same handles. Every UNPIN must succeed exactly once, GET_PAGES
 * must give 0 or EIO, and at the end the provider must hold nothing.
 *
 * Usage: kmod_race_stress [-i rounds] [-p pairs] [-k pins per round] [-d callback delay us]
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kmod_test.h"

#define MAX_PINS 16
#define BUF_LEN (4 * KT_GPU_PAGE)

static int rounds = 2000, npairs = 4, npins = 4, delay_us = 20;
static int sim, gdr;
static const volatile struct gdrcache_revoke_area *area;

struct pair {
	pthread_t owner, freer;
	pthread_barrier_t go, done;
	char *buf;
	uint64_t id;
	unsigned int seed;
	long unpin_fail, pages_bad, pin_fail, free_fail;
	long revoked_seen;	/* GET_PAGES said EIO: the callback won */
	long area_wrong;	/* the area said revoked, GET_PAGES did not */
};

static void *freer_main(void *arg)
{
	struct pair *p = arg;
	int r;

	for (r = 0; r < rounds; r++) {
		pthread_barrier_wait(&p->go);
		if (rand_r(&p->seed) % 4)
			usleep(rand_r(&p->seed) % (delay_us * 2 + 1));
		if (p->id && kt_sim_free(sim, p->id))
			p->free_fail++;
		pthread_barrier_wait(&p->done);
	}
	return NULL;
}

static void *owner_main(void *arg)
{
	struct pair *p = arg;
	uint64_t h[MAX_PINS], persistent, pages[4];
	struct gdrcache_pin pin;
	int r, i, n, ret;

	for (r = 0; r < rounds; r++) {
		p->id = 0;
		if (kt_sim_alloc(sim, p->buf, BUF_LEN, &p->id)) {
			p->pin_fail++;
			p->id = 0;
		}
		for (n = 0; n < npins; n++) {
			if (kt_gdr_pin(gdr, (uintptr_t)p->buf, BUF_LEN, 0, &pin)) {
				p->pin_fail++;
				break;
			}
			h[n] = pin.handle;
		}
		persistent = 0;
		if (!kt_gdr_pin(gdr, (uintptr_t)p->buf, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, &pin))
			persistent = pin.handle;
		else
			p->pin_fail++;

		pthread_barrier_wait(&p->go);
		if (rand_r(&p->seed) % 4)
			usleep(rand_r(&p->seed) % (delay_us * 2 + 1));
		for (i = 0; i < n; i++) {
			int in_area = __atomic_load_n(&area->slot[GDRCACHE_HANDLE_SLOT(h[i])],
						      __ATOMIC_ACQUIRE) == h[i];

			ret = kt_gdr_get_pages(gdr, h[i], pages, 4, NULL);
			if (in_area && ret != -EIO)
				p->area_wrong++;
			if (ret == -EIO)
				p->revoked_seen++;
			else if (ret)
				p->pages_bad++;
			if (kt_gdr_unpin(gdr, h[i]))
				p->unpin_fail++;
			if (kt_gdr_unpin(gdr, h[i]) != -ENOENT)
				p->unpin_fail++;
		}
		pthread_barrier_wait(&p->done);

		/* The persistent pin outlived the FREE. */
		if (persistent) {
			if (kt_gdr_get_pages(gdr, persistent, pages, 1, NULL))
				p->pages_bad++;
			if (kt_gdr_unpin(gdr, persistent))
				p->unpin_fail++;
		}
	}
	return NULL;
}

/* A counter of nvp2p_sim's, from its read-only module parameters. */
static unsigned long read_counter(const char *name)
{
	char path[128];
	unsigned long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/sys/module/nvp2p_sim/parameters/%s", name);
	f = fopen(path, "r");
	if (f) {
		if (fscanf(f, "%lu", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

int main(int argc, char **argv)
{
	struct nvp2p_sim_stats s0, s;
	struct gdrcache_event ev[64];
	struct pair *pairs;
	long unpin_fail = 0, pages_bad = 0, pin_fail = 0, free_fail = 0, revoked = 0;
	long area_wrong = 0;
	struct gdrcache_version v;
	void *m;
	long events = 0;
	struct timespec t0, t1;
	unsigned long waited0, late0;
	ssize_t n;
	int c, i;

	while ((c = getopt(argc, argv, "i:p:k:d:")) != -1) {
		switch (c) {
		case 'i': rounds = atoi(optarg); break;
		case 'p': npairs = atoi(optarg); break;
		case 'k': npins = atoi(optarg); break;
		case 'd': delay_us = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: %s [-i rounds] [-p pairs] [-k pins] [-d delay_us]\n",
				argv[0]);
			return 2;
		}
	}
	if (npins < 1 || npins > MAX_PINS || npairs < 1 || rounds < 1 || delay_us < 0) {
		fprintf(stderr, "bad arguments\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	kt_require_devices();
	sim = kt_sim_open();
	gdr = kt_gdr_open();
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	kt_gdr_version(gdr, &v);
	m = mmap(NULL, v.revoke_area_size, PROT_READ, MAP_SHARED, gdr, 0);
	if (m == MAP_FAILED) {
		perror("mmap /dev/gdrcache");
		return 2;
	}
	area = m;
	kt_sim_stats(sim, &s0);
	waited0 = read_counter("race_put_waited");
	late0 = read_counter("race_put_late");
	kt_check(kt_sim_fault(sim, NVP2P_SIM_FAULT_CALLBACK_DELAY, delay_us) == 0,
		 "callback delay %d us injected", delay_us);
	kt_diag("%d rounds x %d pairs x %d callback pins + 1 persistent", rounds, npairs, npins);

	pairs = calloc(npairs, sizeof(*pairs));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < npairs; i++) {
		pairs[i].buf = kt_gpu_mem(BUF_LEN);
		pairs[i].seed = 12345 + i;
		pthread_barrier_init(&pairs[i].go, NULL, 2);
		pthread_barrier_init(&pairs[i].done, NULL, 2);
		pthread_create(&pairs[i].owner, NULL, owner_main, &pairs[i]);
		pthread_create(&pairs[i].freer, NULL, freer_main, &pairs[i]);
	}
	for (i = 0; i < npairs; i++) {
		pthread_join(pairs[i].owner, NULL);
		pthread_join(pairs[i].freer, NULL);
		unpin_fail += pairs[i].unpin_fail;
		pages_bad += pairs[i].pages_bad;
		pin_fail += pairs[i].pin_fail;
		free_fail += pairs[i].free_fail;
		revoked += pairs[i].revoked_seen;
		area_wrong += pairs[i].area_wrong;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);

	fcntl(gdr, F_SETFL, O_NONBLOCK);
	while ((n = read(gdr, ev, sizeof(ev))) > 0)
		events += n / sizeof(ev[0]);
	kt_sim_stats(sim, &s);
	kt_diag("%.1f s; callbacks fired %llu, GET_PAGES saw EIO %ld times, %ld events read",
		(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
		(unsigned long long)(s.callbacks_fired - s0.callbacks_fired), revoked, events);
	kt_check(pin_fail == 0, "every ALLOC and PIN succeeded (%ld failures)", pin_fail);
	kt_check(free_fail == 0, "every FREE succeeded (%ld failures)", free_fail);
	kt_check(unpin_fail == 0, "every UNPIN succeeded exactly once (%ld failures)", unpin_fail);
	kt_check(pages_bad == 0, "GET_PAGES gave 0 or EIO (%ld others)", pages_bad);
	kt_check(area_wrong == 0, "a handle the area shows revoked was revoked (%ld not)", area_wrong);
	kt_check(s.callbacks_fired > s0.callbacks_fired, "some callbacks fired");
	{
		unsigned long waited = read_counter("race_put_waited") - waited0;
		unsigned long late = read_counter("race_put_late") - late0;

		kt_diag("put_pages waited on a callback in flight %lu times, came after it %lu times",
			waited, late);
		kt_check(waited + late > 0, "UNPIN met a running or finished callback at least once");
	}
	kt_check(s.total_pins - s0.total_pins ==
		 (unsigned long long)rounds * npairs * (npins + 1),
		 "sim: %llu pins made", (unsigned long long)(s.total_pins - s0.total_pins));
	munmap(m, v.revoke_area_size);
	close(gdr);
	kt_sim_expect(sim, 0, 0, 0, "at the end");
	return kt_done();
}
