/* SPDX-License-Identifier: MIT */
/* The public monitors of free events (monitor.c, gdrcache.h): what the rest of the library asks. */
#ifndef GDRCACHE_MONITOR_H
#define GDRCACHE_MONITOR_H

#include <stdbool.h>

#include "common/defs.h"

/* Whether a monitor's callback is running on this thread: the library's calls that take a cache
 * lock refuse then (-EDEADLK: the freeing thread may hold it). */
GDR_HIDDEN bool gdr_monitor_in_callback(void);
/* Log and refuse a call made from a callback; returns -EDEADLK. */
GDR_HIDDEN int gdr_monitor_refuse(const char *what);

#endif /* GDRCACHE_MONITOR_H */
