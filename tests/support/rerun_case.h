/* SPDX-License-Identifier: MIT */
/*
 * What a cmocka case makes of a child run by gdr_rerun (rerun.h): included after <cmocka.h>.
 */
#ifndef GDR_TEST_RERUN_CASE_H
#define GDR_TEST_RERUN_CASE_H

#include <signal.h>
#include <sys/wait.h>

#include "rerun.h"

/* The child's exit status; the case fails where the child was killed (by its alarm: it hung) and
 * is skipped where it could not exec itself (77, qemu-user). mode and err (its stderr) are for the
 * message. */
static inline int gdr_rerun_exit(const char *mode, const char *err, int status)
{
	if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
		fail_msg("%s: hung (killed by its alarm); stderr: %s", mode, err);
	if (WIFSIGNALED(status))
		fail_msg("%s: killed by signal %d; stderr: %s", mode, WTERMSIG(status), err);
	if (WEXITSTATUS(status) == 77)
		skip();
	return WEXITSTATUS(status);
}

#endif /* GDR_TEST_RERUN_CASE_H */
