/* SPDX-License-Identifier: MIT */
/* A test's own program run again in a mode (rerun.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rerun.h"

int gdr_rerun(const char *mode, bool to_file, unsigned alarm_s, char *err, size_t n, int *status,
	      va_list ap)
{
	char path[] = "/tmp/gdr_rerun_XXXXXX";
	ssize_t r = 0, total = 0;
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

		if (alarm_s)
			alarm(alarm_s);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		while ((name = va_arg(ap, const char *)))
			setenv(name, va_arg(ap, const char *), 1);
		execl("/proc/self/exe", program_invocation_short_name, mode, (char *)NULL);
		_exit(77);
	}
	close(p[1]);
	if (!to_file) {
		while ((r = read(p[0], err + total, n - 1 - (size_t)total)) > 0)
			total += r;
		while (r >= 0 && (r = read(p[0], (char[256]){ 0 }, 256)) > 0)
			;
	}
	while (waitpid(pid, status, 0) < 0 && errno == EINTR)
		;
	if (to_file) {
		total = pread(p[0], err, n - 1, 0);
		if (total < 0)
			total = 0;
	}
	err[total] = '\0';
	close(p[0]);
	return 0;
}
