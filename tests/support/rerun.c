/* SPDX-License-Identifier: MIT */
/* A test's own program run again in a mode (rerun.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "deadline.h"
#include "rerun.h"

/* How long past its alarm the child (or a descendant holding its stderr) is waited for before it
 * is killed: its alarm could not end it (SIGALRM blocked or ignored by what it runs). */
#define RERUN_GRACE_MS 30000

/* Milliseconds left to deadline for poll(2): -1 without one (INT64_MAX). */
static int ms_left(int64_t deadline)
{
	int64_t left;

	if (deadline == INT64_MAX)
		return -1;
	left = (deadline - gdr_now_ns()) / 1000000;
	return left < 0 ? 0 : left > 1000 ? 1000 : (int)left;
}

/* Reads what the child writes to its stderr pipe (fd) into err (n bytes with the NUL), the rest
 * dropped, until its end or the deadline: the length read. */
static ssize_t read_until(int fd, char *err, size_t n, int64_t deadline)
{
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	ssize_t r, total = 0;

	for (;;) {
		int rc = poll(&pfd, 1, ms_left(deadline));

		if (rc < 0 && errno == EINTR)
			continue;
		if (rc < 0 || (rc == 0 && gdr_deadline_passed(deadline)))
			return total;
		if (rc == 0)
			continue;
		if ((size_t)total < n - 1)
			r = read(fd, err + total, n - 1 - (size_t)total);
		else
			r = read(fd, (char[256]){ 0 }, 256);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return total;
		if ((size_t)total < n - 1)
			total += r;
	}
}

/* Waits for pid until the deadline (none: INT64_MAX), then kills it (SIGKILL) and reaps it. */
static void reap_by(pid_t pid, int *status, int64_t deadline)
{
	while (deadline != INT64_MAX) {
		pid_t w = waitpid(pid, status, WNOHANG);

		if (w == pid || (w < 0 && errno != EINTR))
			return;
		if (w == 0 && gdr_deadline_passed(deadline))
			break;
		if (w == 0)
			nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
	}
	if (deadline != INT64_MAX)
		kill(pid, SIGKILL);
	while (waitpid(pid, status, 0) < 0 && errno == EINTR)
		;
}

int gdr_rerun(const char *mode, bool to_file, unsigned alarm_s, char *err, size_t n, int *status,
	      va_list ap)
{
	char path[] = "/tmp/gdr_rerun_XXXXXX";
	unsigned alarm_scaled = alarm_s * (unsigned)gdr_deadline_scale();
	int64_t deadline = INT64_MAX;
	ssize_t total = 0;
	int p[2];
	pid_t pid;

	if (to_file) {
		p[0] = mkstemp(path);
		if (p[0] < 0)
			return -errno;
		unlink(path);
		p[1] = dup(p[0]);
	} else if (pipe(p)) {
		return -errno;
	}
	pid = fork();
	if (pid < 0) {
		int e = errno;

		close(p[0]);
		close(p[1]);
		return -e;
	}
	if (!pid) {
		const char *name;

		if (alarm_s) {
			sigset_t alrm;

			/* exec keeps a blocked or ignored SIGALRM: the alarm must end it */
			sigemptyset(&alrm);
			sigaddset(&alrm, SIGALRM);
			sigprocmask(SIG_UNBLOCK, &alrm, NULL);
			signal(SIGALRM, SIG_DFL);
			alarm(alarm_scaled);
		}
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		while ((name = va_arg(ap, const char *)))
			setenv(name, va_arg(ap, const char *), 1);
		execl("/proc/self/exe", program_invocation_short_name, mode, (char *)NULL);
		_exit(77);
	}
	close(p[1]);
	if (alarm_s)
		deadline = gdr_deadline_ms((int64_t)alarm_s * 1000 + RERUN_GRACE_MS);
	if (!to_file)
		total = read_until(p[0], err, n, deadline);
	reap_by(pid, status, deadline);
	if (to_file) {
		total = pread(p[0], err, n - 1, 0);
		if (total < 0)
			total = 0;
	}
	err[total] = '\0';
	close(p[0]);
	return 0;
}
