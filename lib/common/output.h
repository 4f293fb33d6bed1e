/* SPDX-License-Identifier: MIT */
/* Where logs and statistics go: the settings config.c parses for log.c and stats.c, and the
 * statistics records stats.c writes (for the caches, the interception and the preload). */
#ifndef GDR_OUTPUT_H
#define GDR_OUTPUT_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

enum gdr_stats_format {
	GDR_STATS_AUTO = 0, /* text on stderr, json in a file */
	GDR_STATS_TEXT = 1, /* the human line: "gdrcache[PID] stats (...): key value ..." */
	GDR_STATS_KV = 2,   /* one line "gdrcache_stats key=value ..." */
	GDR_STATS_JSON = 3, /* one JSON object a line (JSON Lines) */
};

struct gdr_output {
	char log_file[256];      /* GDRCACHE_LOG_FILE; "": stderr; %p, %h, %r: gdr_path_expand */
	bool log_file_ready;     /* log_file was parsed (__atomic: log.c may run meanwhile) */
	bool log_set;            /* GDRCACHE_LOG is set and not empty */
	char stats_file[256];    /* GDRCACHE_STATS=file:PATH; "": stderr */
	int stats_format;        /* enum gdr_stats_format (GDRCACHE_STATS_FORMAT) */
	int stats_signal;        /* GDRCACHE_STATS_SIGNAL; 0: none */
	unsigned stats_interval; /* GDRCACHE_STATS_INTERVAL, seconds; 0: none */
	bool disable;            /* GDRCACHE_DISABLE (the preload's pass-through) */
};
/* The settings, parsed with the rest of the configuration (config.c). */
const struct gdr_output *gdr_config_output(void);
/* GDRCACHE_LOG_FILE once parsed, else NULL (never reads the environment: log.c's own calls). */
const char *gdr_config_log_file(void);
/* GDRCACHE_STATS_INTERVAL's largest value (a day). */
#define GDR_STATS_INTERVAL_MAX 86400u
/* tmpl with %p replaced by the pid, %h by the host name, %r by the MPI rank ("norank" where no
 * launcher's variable gives one: ident.h) and %% by %. 0, or -ENAMETOOLONG. */
int gdr_path_expand(const char *tmpl, char *buf, size_t n);

/* log.c: where text meant for stderr goes: 2, or -1 when descriptor 2 is no longer the stderr the
 * process had when the library was loaded (closed then, or since replaced by a socket). */
int gdr_stderr_fd(void);
/* log.c: write(2) that never raises SIGPIPE in the program (a reader gone: the text is lost). */
ssize_t gdr_write_quiet(int fd, const void *p, size_t n);

/* log.c: gdr_log_write with a va_list (the preload's lines, private.h). */
void gdr_log_vwrite(int level, const char *func, int line, const char *fmt, va_list ap);

/* One value of a statistics record: a number, or a string when str is not NULL. (The preload passes
 * arrays of these through gdr_private_stats_emit: its layout is theirs too.) */
struct gdr_stat {
	const char *key;
	const char *str;
	uint64_t num;
};
/*
 * Write one record where GDRCACHE_STATS says, in GDRCACHE_STATS_FORMAT, with one write(2):
 * source names what it describes ("cache", "preload"), why when ("exit", "destroy", "signal",
 * "interval"). The text form is "PREFIX[PID] stats HEAD: key value ..." (its strings only in
 * HEAD); kv and json carry every value after source, why, pid, time, schema, host, rank and
 * mono_ns (docs/statistics.md: every field).
 */
void gdr_stats_emit(const char *source, const char *why, const char *prefix, const char *head,
		    const struct gdr_stat *v, unsigned n);
/* The records' schema (the "schema" field): 2 since host, rank, cache_id, mono_ns and the
 * interception's numbers; 1 (no field) before. */
#define GDR_STATS_SCHEMA 2
/* fn(why) is called for every statistics dump of the process on GDRCACHE_STATS_SIGNAL and every
 * GDRCACHE_STATS_INTERVAL. */
int gdr_stats_on_signal(void (*fn)(const char *why));
/* Starts the statistics thread, once, if GDRCACHE_STATS_SIGNAL or GDRCACHE_STATS_INTERVAL is set,
 * and installs the signal's handler if the first is. */
void gdr_stats_signal_setup(void);

#endif /* GDR_OUTPUT_H */
