/* SPDX-License-Identifier: MIT */
/*
 * A test that needs a process of its own for a case (its own environment, which the library reads
 * once; a crash or a hang that must not take the suite with it) runs its own program again in a
 * mode: gdr_rerun (rerun.c).
 */
#ifndef GDR_TEST_RERUN_H
#define GDR_TEST_RERUN_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

/* Runs /proc/self/exe again with argv { its name, mode }, the environment pairs of ap (name, value,
 * ..., NULL) set, under alarm(alarm_s) (0: none; multiplied by GDR_TEST_WAIT_SCALE: deadline.h).
 * A child, or a descendant holding its stderr, that outlives the alarm by 30 s (scaled) is killed:
 * *status is then SIGKILL's. Its stderr is a pipe, or with to_file a file that
 * the child can read back by pread(2, ...); its text goes into err (n bytes with the NUL), the rest
 * read and dropped (a writer must not die of SIGPIPE because the text was long). *status: its
 * wait status; an exit status of 77 means it could not exec itself (qemu-user). 0, or -errno when
 * it could not be run. */
int gdr_rerun(const char *mode, bool to_file, unsigned alarm_s, char *err, size_t n, int *status,
	      va_list ap);

#endif /* GDR_TEST_RERUN_H */
