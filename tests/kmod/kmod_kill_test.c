// SPDX-License-Identifier: MIT
/*
 * kmod_kill_test: a process that dies holding pins gives them all back.
 *  1. a child pins (callback and persistent), maps the revocation area, blocks
 *     in read() on another thread, and is SIGKILLed;
 *  2. the same, but the child's /dev/gdrcache file lives on in a grandchild
 *     (which may not use it: EACCES): the pins go with the child all the same;
 *  3. children SIGKILLed at random moments while they pin, unpin and FREE with
 *     a callback delay injected (kill racing with callbacks and unpins).
 * After each, nvp2p_sim must hold no pin and no allocation.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kmod_test.h"

#define BUF_LEN (8 * KT_GPU_PAGE)

static int sim;

static void *blocked_reader(void *arg)
{
	struct gdrcache_event ev;
	int fd = *(int *)arg;

	for (;;)
		if (read(fd, &ev, sizeof(ev)) < 0)
			return NULL;
}

/* Child body of cases 1 and 2: pin, tell the parent, wait to be killed. */
static void pin_and_wait(int ready_fd, int with_grandchild)
{
	int csim = kt_sim_open(), fd = kt_gdr_open(), i, gc_pipe[2];
	char *buf = kt_gpu_mem(BUF_LEN), *buf2 = kt_gpu_mem(BUF_LEN);
	struct gdrcache_version v;
	pthread_t t;
	char ok = 'y';
	uint64_t id;

	if (kt_sim_alloc(csim, buf, BUF_LEN, &id) || kt_sim_alloc(csim, buf2, BUF_LEN, &id))
		ok = 'a';
	for (i = 0; i < 4; i++)
		if (kt_gdr_pin(fd, (uintptr_t)buf, BUF_LEN, 0, NULL) ||
		    kt_gdr_pin(fd, (uintptr_t)buf2, KT_GPU_PAGE, GDRCACHE_PIN_PERSISTENT, NULL))
			ok = 'p';
	kt_gdr_version(fd, &v);
	if (mmap(NULL, v.revoke_area_size, PROT_READ, MAP_SHARED, fd, 0) == MAP_FAILED)
		ok = 'm';
	pthread_create(&t, NULL, blocked_reader, &fd);
	if (with_grandchild) {
		/* The grandchild keeps both files open but may not use ours. */
		if (pipe(gc_pipe))
			ok = 'g';
		if (fork() == 0) {
			char r = kt_gdr_version(fd, &v) == -EACCES ? 'y' : 'e';

			if (write(gc_pipe[1], &r, 1) != 1)
				_exit(1);
			for (;;)
				pause();
		}
		if (read(gc_pipe[0], &ok, 1) != 1)
			ok = 'g';
	}
	if (write(ready_fd, &ok, 1) != 1)
		_exit(1);
	for (;;)
		pause();
}

static int wait_idle(struct nvp2p_sim_stats *s)
{
	int i;

	/* Release runs before the parent's waitpid() returns; allow a little slack. */
	for (i = 0; i < 50; i++) {
		kt_sim_stats(sim, s);
		if (!s->outstanding_pins && !s->outstanding_persistent && !s->allocations)
			return 1;
		usleep(100 * 1000);
	}
	return 0;
}

static void report_idle(const char *what)
{
	struct nvp2p_sim_stats s;
	int idle = wait_idle(&s);

	kt_check(idle, "%s: sim holds %llu callback pins, %llu persistent, %llu allocations", what,
		 (unsigned long long)s.outstanding_pins,
		 (unsigned long long)s.outstanding_persistent,
		 (unsigned long long)s.allocations);
}

static void kill_holder(int with_grandchild)
{
	struct nvp2p_sim_stats s;
	int p[2], status;
	pid_t pid;
	char ok = 0;

	if (pipe(p)) {
		perror("pipe");
		exit(2);
	}
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		setpgid(0, 0);
		pin_and_wait(p[1], with_grandchild);
	}
	close(p[1]);
	setpgid(pid, pid);
	if (read(p[0], &ok, 1) != 1)
		ok = '?';
	kt_check(ok == 'y', "child pinned and mapped (%c)", ok);
	if (with_grandchild)
		kt_diag("grandchild: ioctl on the inherited file gave EACCES");
	close(p[0]);
	kt_sim_expect(sim, 4, 4, 2, "while the child holds its pins");
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	kt_check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "child SIGKILLed");
	if (with_grandchild) {
		int i;

		for (i = 0; i < 50; i++) {
			kt_sim_stats(sim, &s);
			if (!s.outstanding_pins && !s.outstanding_persistent)
				break;
			usleep(20 * 1000);
		}
		kt_check(!s.outstanding_pins && !s.outstanding_persistent,
			 "the owner's death released its pins though the grandchild holds the file "
			 "(%llu left)",
			 (unsigned long long)(s.outstanding_pins + s.outstanding_persistent));
		kill(-pid, SIGKILL);	/* the grandchild, in the child's group */
		usleep(200 * 1000);
	}
	report_idle(with_grandchild ? "after the grandchild died" : "after SIGKILL");
}

/* Child body of case 3: churn until killed. */
static void churn(unsigned int seed)
{
	int csim = kt_sim_open(), fd = kt_gdr_open(), i;
	char *buf = kt_gpu_mem(BUF_LEN);
	struct gdrcache_pin pin;
	uint64_t id, h[4];

	for (;;) {
		if (kt_sim_alloc(csim, buf, BUF_LEN, &id))
			_exit(3);
		for (i = 0; i < 4; i++) {
			h[i] = 0;
			if (!kt_gdr_pin(fd, (uintptr_t)buf, BUF_LEN, i == 3 ? GDRCACHE_PIN_PERSISTENT : 0,
					&pin))
				h[i] = pin.handle;
		}
		if (rand_r(&seed) % 2)
			kt_gdr_unpin(fd, h[rand_r(&seed) % 4]);
		kt_sim_free(csim, id);
		for (i = 0; i < 4; i++)
			if (rand_r(&seed) % 2)
				kt_gdr_unpin(fd, h[i]);
	}
}

int main(int argc, char **argv)
{
	int rounds = argc > 1 ? atoi(argv[1]) : 100, r, status;
	unsigned int seed = 4242;
	pid_t pid;

	setvbuf(stdout, NULL, _IOLBF, 0);
	kt_require_devices();
	sim = kt_sim_open();
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	report_idle("at start");

	kill_holder(0);
	kill_holder(1);

	kt_sim_fault(sim, NVP2P_SIM_FAULT_CALLBACK_DELAY, 200);
	for (r = 0; r < rounds; r++) {
		pid = fork();
		if (pid == 0)
			churn(seed + r);
		usleep(rand_r(&seed) % 20000);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		if (!WIFSIGNALED(status)) {
			kt_check(0, "churning child %d died by itself (status 0x%x)", r, status);
			break;
		}
	}
	kt_sim_fault(sim, NVP2P_SIM_FAULT_NONE, 0);
	kt_diag("%d churning children killed at random moments", r);
	report_idle("after the churning children");
	return kt_done();
}
