/* SPDX-License-Identifier: MIT */
/*
 * Logging: one macro with levels (log.h), for the library, the preload and the tool,
 * written to stderr or GDRCACHE_LOG_FILE (appended to; %p the pid, %h the host, %r the rank) as
 *   gdrcache[PID:TID] YYYY-MM-DDTHH:MM:SS.mmmZ LEVEL: message (function:line host=H rank=R cache=N)
 * host: the node's name; rank: the launcher's (ident.c), left out where none gives one; cache: the
 * id of the cache the thread works for (ident.h's gdr_ident_cache), left out where none is known.
 * The identity is read with the configuration (config.c): a line written before that (a bad
 * argument to gdr_set_log_level as the process's first call) has none.
 * Each line is one write(2), so lines of several threads or processes sharing a file never mix. A
 * file that cannot be opened is said once on stderr, and lines go to stderr instead.
 *
 * Lines never flood: each call site (function and line) prints its first GDR_LOG_BURST lines, then
 * at most one line per GDR_LOG_INTERVAL_S seconds, which says how many like it were suppressed
 * since the last one printed. Debug lines are not limited (asked for explicitly). A registration
 * refused thousands of times a second (pool memory the driver will not export, say) costs the
 * log a few lines a minute.
 *
 * A program's handler (gdr_set_log_handler) takes the lines that pass the level and the limit
 * instead: the message alone, with " (N more like this suppressed)" where the default sink adds
 * "; N more like this suppressed".
 */
#define _GNU_SOURCE /* strerrordesc_np */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/config.h"
#include "common/defs.h"
#include "common/ident.h"
#include "common/log.h"
#include "common/output.h"

int gdr_log_level = GDR_LOG_WARN;

/* Not gmtime_r and strftime: the first gmtime_r of a process reads TZ (tzset), and a line may be
 * written by the statistics thread, or any thread, while the program rebuilds its environment
 * (bash does before every command it runs; setenv reallocates the array): a read of freed memory.
 * Days since 1970-01-01 to a civil date in the proleptic Gregorian calendar, by 400-year eras
 * of 146,097 days counted from 0000-03-01 (so the leap day ends a year). */
void gdr_utc_format(char *buf, size_t n, const struct timespec *ts)
{
	int64_t sec = ts->tv_sec, days = sec / 86400, rem = sec % 86400;
	int64_t era, doe, yoe, doy, mp, y;
	unsigned month, day;
	char out[96];
	size_t len;

	if (rem < 0) {
		rem += 86400;
		days--;
	}
	days += 719468; /* 0000-03-01 to 1970-01-01 */
	era = (days >= 0 ? days : days - 146096) / 146097;
	doe = days - era * 146097;                                   /* [0, 146096] */
	yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; /* [0, 399] */
	doy = doe - (365 * yoe + yoe / 4 - yoe / 100);               /* [0, 365], from March 1st */
	mp = (5 * doy + 2) / 153;                                    /* [0, 11], March is 0 */
	day = (unsigned)(doy - (153 * mp + 2) / 5 + 1);
	month = (unsigned)(mp < 10 ? mp + 3 : mp - 9);
	y = yoe + era * 400 + (month <= 2);
	snprintf(out, sizeof(out), "%04lld-%02u-%02uT%02u:%02u:%02u.%03uZ", (long long)y, month,
		 day, (unsigned)(rem / 3600), (unsigned)(rem / 60 % 60), (unsigned)(rem % 60),
		 (unsigned)(ts->tv_nsec / 1000000));
	len = strlen(out) < n ? strlen(out) : n - 1;
	if (n) {
		memcpy(buf, out, len);
		buf[len] = '\0';
	}
}

void gdr_utc_stamp(char *buf, size_t n)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	gdr_utc_format(buf, n, &ts);
}

/* glibc's strerror translates through gettext, which reads LANGUAGE with getenv on every call. */
const char *gdr_strerror(int err)
{
	const char *s = strerrordesc_np(err);

	return s ? s : "Unknown error";
}

/* Whether the program chose a level (gdr_set_log_level), and the preload's wish for quiet
 * (gdr_log_quiet) against it: under level_lock. */
static pthread_mutex_t level_lock = PTHREAD_MUTEX_INITIALIZER;
static bool level_chosen;

GDR_EXPORT int gdr_set_log_level(int level)
{
	int saved = errno, old;

	if (level < GDR_LOG_NONE || level > GDR_LOG_DEBUG) {
		gdr_err("unknown log level %d", level);
		return -EINVAL;
	}
	(void)gdr_config_get(); /* GDRCACHE_LOG first, so that this overrides it */
	pthread_mutex_lock(&level_lock);
	level_chosen = true;
	old = __atomic_exchange_n(&gdr_log_level, level, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&level_lock);
	errno = saved;
	return old;
}

bool gdr_log_quiet(void)
{
	bool quiet;

	(void)gdr_config_get();
	pthread_mutex_lock(&level_lock);
	quiet = !level_chosen && !gdr_config_output()->log_set;
	if (quiet)
		__atomic_store_n(&gdr_log_level, GDR_LOG_NONE, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&level_lock);
	return quiet;
}

/* A handler and its argument: set together, so that a line logged while another thread replaces
 * them goes to the old pair or the new one, whole. A pair is never changed or freed once made (a
 * line being written holds it without a lock: the log path takes no lock for it, allocates
 * nothing, and may run in a free hook); every pair made is on a list, and one set again is taken
 * from there, so that a program switching between a few handlers makes only a few. */
struct log_handler {
	gdr_log_fn fn;
	void *arg;
	struct log_handler *next; /* the one made before it */
};
static struct log_handler *log_handler;  /* in use (NULL: the default sink); __atomic */
static struct log_handler *log_handlers; /* every one made; __atomic, pushed only */

GDR_EXPORT int gdr_set_log_handler(gdr_log_fn fn, void *arg)
{
	struct log_handler *h = NULL;
	int saved = errno;

	if (fn) {
		struct log_handler *head = __atomic_load_n(&log_handlers, __ATOMIC_ACQUIRE);

		for (h = head; h && (h->fn != fn || h->arg != arg); h = h->next)
			;
		if (!h) { /* two threads setting the same pair at once may make it twice: harmless */
			h = malloc(sizeof(*h));
			if (!h) {
				errno = saved;
				return -ENOMEM;
			}
			h->fn = fn;
			h->arg = arg;
			h->next = head;
			while (!__atomic_compare_exchange_n(&log_handlers, &h->next, h, false,
							    __ATOMIC_RELEASE, __ATOMIC_ACQUIRE))
				;
		}
	}
	__atomic_store_n(&log_handler, h, __ATOMIC_RELEASE);
	errno = saved;
	return 0;
}

static const char *const level_names[] = { "none", "error", "warn", "info", "debug" };

#define SITES 256 /* call sites tracked; past that, lines are not limited */

static struct site {
	const char *func;
	int line;
	uint32_t printed;    /* lines printed, up to GDR_LOG_BURST */
	uint64_t last_ns;    /* when the last one was printed */
	uint64_t suppressed; /* since then */
} sites[SITES];
static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t fd_lock = PTHREAD_MUTEX_INITIALIZER; /* log_fd's state */

/* fork(): a child must not inherit these locked by a thread it does not have (its first line
 * would wait forever). Both are leaves, taken last: registered before any other handler of the
 * library (at load), so that theirs (which run first, in reverse order) take the locks that a
 * thread holds while it logs. */
static void fork_prepare(void)
{
	pthread_mutex_lock(&sites_lock);
	pthread_mutex_lock(&fd_lock);
}

static void fork_done(void)
{
	pthread_mutex_unlock(&fd_lock);
	pthread_mutex_unlock(&sites_lock);
}

/* What descriptor 2 was when the library was loaded. */
static struct {
	bool open;
	dev_t dev;
	ino_t ino;
} stderr0;

__attribute__((constructor)) static void log_init(void)
{
	struct stat st;

	pthread_atfork(fork_prepare, fork_done, fork_done);
	if (!fstat(2, &st)) {
		stderr0.open = true;
		stderr0.dev = st.st_dev;
		stderr0.ino = st.st_ino;
	}
}

/* A program that closes stderr may have descriptor 2 reused by its next socket (or file): the
 * library's lines must not go into the program's byte stream. A redirection (dup2 of a file or
 * pipe onto 2) is still followed; a socket is written to only if it was stderr from the start
 * (systemd's journal). */
int gdr_stderr_fd(void)
{
	struct stat st;

	if (!stderr0.open || fstat(2, &st))
		return -1;
	if (S_ISSOCK(st.st_mode) && (st.st_dev != stderr0.dev || st.st_ino != stderr0.ino))
		return -1;
	return 2;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Whether this line of func:line may be printed; *suppressed: how many were not, since the last. */
static bool site_allows(const char *func, int line, uint64_t *suppressed)
{
	size_t h = ((uintptr_t)func >> 4 ^ (size_t)line * 2654435761u) % SITES;
	uint64_t now = now_ns();
	bool ok = true;

	*suppressed = 0;
	pthread_mutex_lock(&sites_lock);
	for (size_t i = 0; i < SITES; i++) {
		struct site *s = &sites[(h + i) % SITES];

		if (!s->func) {
			s->func = func;
			s->line = line;
		} else if (s->func != func || s->line != line) {
			continue;
		}
		if (s->printed < GDR_LOG_BURST) {
			s->printed++;
		} else if (now - s->last_ns >= (uint64_t)GDR_LOG_INTERVAL_S * 1000000000u) {
			*suppressed = s->suppressed;
			s->suppressed = 0;
		} else {
			s->suppressed++;
			ok = false;
		}
		if (ok)
			s->last_ns = now;
		break;
	}
	pthread_mutex_unlock(&sites_lock);
	return ok;
}

/* As libpq does: SIGPIPE blocked in this thread for the call; one that this write raised is taken
 * back, one already pending stays the program's. */
ssize_t gdr_write_quiet(int fd, const void *p, size_t n)
{
	struct timespec zero = { 0, 0 };
	sigset_t pipe_set, old, pending;
	bool was_pending;
	ssize_t r;
	int saved;

	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	was_pending = !sigpending(&pending) && sigismember(&pending, SIGPIPE);
	r = write(fd, p, n);
	saved = errno;
	if (r < 0 && saved == EPIPE && !was_pending)
		while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR)
			;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	errno = saved;
	return r;
}

/* The fd lines go to: GDRCACHE_LOG_FILE's, opened on first use (again in a child of fork when the
 * name has the pid in it), or 2. No cancellation point acts under fd_lock: a thread cancelled in
 * the open (a FIFO without a reader blocks there) would leave every later line waiting for it. */
static int log_fd(void)
{
	static int fd = -1;
	static pid_t owner;
	static bool failed;
	const char *tmpl = gdr_config_log_file();
	char path[4096];
	int ret, cancel;

	if (!tmpl || !*tmpl)
		return gdr_stderr_fd();
	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	pthread_mutex_lock(&fd_lock);
	if (fd >= 0 && owner != getpid() && strstr(tmpl, "%p")) {
		close(fd);
		fd = -1;
		failed = false;
	}
	if (fd < 0 && !failed) {
		int err = gdr_path_expand(tmpl, path, sizeof(path));

		if (!err) {
			fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
			err = fd < 0 ? errno : 0;
		}
		if (err) {
			char msg[512];
			int n = snprintf(
				msg, sizeof(msg),
				"gdrcache[%d] warn: GDRCACHE_LOG_FILE=%s cannot be opened (%s): "
				"logging to stderr\n",
				(int)getpid(), tmpl, gdr_strerror(err < 0 ? -err : err));

			if (n > 0 && gdr_stderr_fd() >= 0)
				(void)gdr_write_quiet(2, msg,
						      (size_t)n < sizeof(msg) ? (size_t)n
									      : sizeof(msg) - 1);
			failed = true;
		}
		owner = getpid();
	}
	ret = fd;
	pthread_mutex_unlock(&fd_lock);
	pthread_setcancelstate(cancel, NULL);
	if (ret < 0)
		ret = gdr_stderr_fd();
	return ret;
}

void gdr_log_vwrite(int level, const char *func, int line, const char *fmt, va_list ap)
{
	const char *name = level >= 0 && level <= GDR_LOG_DEBUG ? level_names[level] : "?";
	int saved = errno, n;
	uint64_t suppressed = 0;
	char msg[512], more[64] = "", when[32], out[768];
	char who[128] = "";
	const struct log_handler *h;
	const struct gdr_ident *id;
	uint64_t cache;

	if (level < GDR_LOG_DEBUG && !site_allows(func, line, &suppressed)) {
		errno = saved;
		return;
	}
	vsnprintf(msg, sizeof(msg), fmt, ap);
	h = __atomic_load_n(&log_handler, __ATOMIC_ACQUIRE); /* once: fn and arg of one pair */
	if (h) {
		if (suppressed)
			snprintf(out, sizeof(out), "%s (%llu more like this suppressed)", msg,
				 (unsigned long long)suppressed);
		h->fn(h->arg, level, suppressed ? out : msg);
		errno = saved;
		return;
	}
	if (suppressed)
		snprintf(more, sizeof(more), "; %llu more like this suppressed",
			 (unsigned long long)suppressed);
	gdr_utc_stamp(when, sizeof(when));
	id = gdr_ident();
	cache = gdr_ident_cache;
	if (id) {
		int w = snprintf(who, sizeof(who), " host=%s", id->host);

		if (id->rank >= 0 && w > 0 && (size_t)w < sizeof(who))
			w += snprintf(who + w, sizeof(who) - (size_t)w, " rank=%d", id->rank);
		if (cache && w > 0 && (size_t)w < sizeof(who))
			snprintf(who + w, sizeof(who) - (size_t)w, " cache=%llu",
				 (unsigned long long)cache);
	} else if (cache) {
		snprintf(who, sizeof(who), " cache=%llu", (unsigned long long)cache);
	}
	n = snprintf(out, sizeof(out), "gdrcache[%d:%ld] %s %s: %s (%s:%d%s%s)\n", (int)getpid(),
		     (long)syscall(SYS_gettid), when, name, msg, func, line, who, more);
	if (n >= (int)sizeof(out)) { /* cut: still one line */
		n = sizeof(out) - 1;
		out[n - 1] = '\n';
	}
	if (n > 0) {
		int fd = log_fd();

		if (fd >= 0)
			(void)gdr_write_quiet(fd, out, (size_t)n);
	}
	errno = saved;
}

void gdr_log_write(int level, const char *func, int line, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	gdr_log_vwrite(level, func, line, fmt, ap);
	va_end(ap);
}
