/* SPDX-License-Identifier: MIT */
/*
 * Statistics: counters live in struct gdr_cache; this writes them out, at gdr_cache_destroy, at
 * exit, on GDRCACHE_STATS_SIGNAL and every GDRCACHE_STATS_INTERVAL seconds, to stderr or the file
 * of GDRCACHE_STATS=file:PATH, as the text line, key=value or JSON (GDRCACHE_STATS_FORMAT). Each
 * record is one write(2) on a file opened for appending, so the records of several processes
 * sharing a file never mix. Every field of a record, its type and meaning: docs/statistics.md.
 *
 * The signal: its handler only writes a byte to a non-blocking pipe (async-signal-safe, no lock,
 * no allocation), then calls the handler that was installed before it, if any; a thread started
 * with the handler reads the pipe and writes the records, where taking the caches' locks and
 * formatting are safe. Formatting inside the handler instead would need the cache's counters
 * without its lock and a formatter without stdio; a thread costs one blocked poll(2). The same
 * thread writes the periodic records: its poll's timeout is the next one's time (CLOCK_MONOTONIC),
 * so it wakes once per interval and never spins. A child of fork() has no such thread: neither
 * signal nor periodic records there, only its records at destroy and exit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cache/cache.h"
#include "cache/thread.h"
#include "common/ident.h"
#include "common/json.h"
#include "common/log.h"
#include "common/output.h"
#include "intercept/hooks.h"

static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct gdr_cache *live;

void gdr_stats_pinned(struct gdr_cache *c, int64_t delta)
{
	c->st.pinned_bytes += (uint64_t)delta;
	if (c->st.pinned_bytes > c->st.pinned_bytes_peak)
		c->st.pinned_bytes_peak = c->st.pinned_bytes;
}

void gdr_stats_collect(struct gdr_cache *c, struct gdr_cache_stats *s)
{
	uint64_t fast, tags;

	*s = c->st;
	gdr_thr_totals(c, &fast, &tags);
	s->fast_hits = fast;
	s->hits += fast;
	s->tag_checks += tags;
	s->exact_mrs = __atomic_load_n(&c->exact_mrs, __ATOMIC_RELAXED);
	s->exact_replaced = __atomic_load_n(&c->exact_replaced, __ATOMIC_RELAXED);
}

/* ---- One record, formatted ------------------------------------------------------------------ */

struct buf {
	char *p;
	size_t len, cap;
};

static void put(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->len >= b->cap)
		return;
	va_start(ap, fmt);
	n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
	va_end(ap);
	b->len = n < 0 ? b->cap : b->len + (size_t)n;
}

/* A JSON string (common/json.c's escaping, the one gdrcache_info uses), cut as put() cuts. */
static void put_json_str(struct buf *b, const char *s)
{
	if (b->len < b->cap)
		b->len += gdr_json_quote(b->p + b->len, b->cap - b->len, s);
}

/* A kv value: as it is when it has no blank, quote or backslash; else quoted and escaped. */
static void put_kv_str(struct buf *b, const char *s)
{
	if (*s && !strpbrk(s, " \t\n\"\\="))
		put(b, "%s", s);
	else
		put_json_str(b, s);
}

/* Where records go: the file (opened per record: *close_it), or stderr when it cannot be (said
 * once); -1: nowhere (stderr gone, log.c). */
static int stats_fd(const struct gdr_output *o, bool *close_it)
{
	char path[4096];
	int fd, err;

	*close_it = false;
	if (!o->stats_file[0])
		return gdr_stderr_fd();
	err = gdr_path_expand(o->stats_file, path, sizeof(path));
	if (!err) {
		fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0) {
			*close_it = true;
			return fd;
		}
		err = -errno;
	}
	gdr_log_once(GDR_LOG_WARN,
		     "GDRCACHE_STATS=file:%s cannot be opened (%s): statistics go to "
		     "stderr",
		     o->stats_file, gdr_strerror(-err));
	return gdr_stderr_fd();
}

/* b, one line or several, in one write(2). */
static void stats_write(const struct gdr_output *o, struct buf *b)
{
	bool close_it;
	int fd;

	if (b->len >= b->cap) { /* cannot happen with today's fields: keep the record whole lines */
		b->len = b->cap - 1;
		b->p[b->len - 1] = '\n';
	}
	fd = stats_fd(o, &close_it);
	if (fd < 0)
		return;
	(void)gdr_write_quiet(fd, b->p, b->len);
	if (close_it)
		close(fd);
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void gdr_stats_emit(const char *source, const char *why, const char *prefix, const char *head,
		    const struct gdr_stat *v, unsigned n)
{
	const struct gdr_output *o = gdr_config_output();
	const struct gdr_ident *id = gdr_ident(); /* read with the configuration: never NULL here */
	const char *host = id ? id->host : "unknown";
	int format = o->stats_format, rank = id ? id->rank : -1;
	char stack[8192], when[40];
	struct buf b = { stack, 0, sizeof(stack) };
	uint64_t mono = mono_ns();

	if (format == GDR_STATS_AUTO)
		format = o->stats_file[0] ? GDR_STATS_JSON : GDR_STATS_TEXT;
	gdr_utc_stamp(when, sizeof(when)); /* not gmtime_r: this may be the signal thread */

	if (format == GDR_STATS_TEXT) {
		put(&b, "%s[%d] stats%s:", prefix, (int)getpid(), head);
		for (unsigned i = 0; i < n; i++)
			if (!v[i].str)
				put(&b, " %s %" PRIu64, v[i].key, v[i].num);
		put(&b, "\n");
	} else if (format == GDR_STATS_KV) {
		put(&b, "gdrcache_stats source=%s why=", source);
		put_kv_str(&b, why);
		put(&b, " pid=%d time=%s schema=%d host=", (int)getpid(), when, GDR_STATS_SCHEMA);
		put_kv_str(&b, host);
		put(&b, " rank=%d mono_ns=%" PRIu64, rank, mono);
		for (unsigned i = 0; i < n; i++) {
			put(&b, " %s=", v[i].key);
			if (v[i].str)
				put_kv_str(&b, v[i].str);
			else
				put(&b, "%" PRIu64, v[i].num);
		}
		put(&b, "\n");
	} else {
		put(&b, "{\"source\": ");
		put_json_str(&b, source);
		put(&b, ", \"why\": ");
		put_json_str(&b, why);
		put(&b,
		    ", \"pid\": %d, \"time\": \"%s\", \"schema\": %d, \"host\": ", (int)getpid(),
		    when, GDR_STATS_SCHEMA);
		put_json_str(&b, host);
		put(&b, ", \"rank\": %d, \"mono_ns\": %" PRIu64, rank, mono);
		for (unsigned i = 0; i < n; i++) {
			put(&b, ", \"%s\": ", v[i].key);
			if (v[i].str)
				put_json_str(&b, v[i].str);
			else
				put(&b, "%" PRIu64, v[i].num);
		}
		put(&b, "}\n");
	}
	stats_write(o, &b);
}

/* ---- A cache's record ----------------------------------------------------------------------- */

/* The interception's state in a record, a number and its name: from gdr_intercept_get_stats's
 * state (0 or -errno). */
enum icpt_state {
	ICPT_IN_EFFECT = 0, /* every route to a free proven intercepted: free events possible */
	ICPT_OFF = 1,       /* turned off (GDRCACHE_INTERCEPT=off, a cache's attribute) */
	ICPT_YIELDED = 2,   /* GDRCACHE_INTERCEPT=yield found another tool's patch */
	ICPT_NO_DRIVER = 3, /* no CUDA driver */
	ICPT_UNPROVEN = 4,  /* installed, but a route is not intercepted (or another error) */
	ICPT_UNKNOWN = 5,   /* not asked: a child of fork(), or a thread holding a cache's lock */
};
static const char *const icpt_names[] = { "in_effect", "off",      "yielded",
					  "no_driver", "unproven", "unknown" };

static enum icpt_state icpt_state_of(int state)
{
	return !state                 ? ICPT_IN_EFFECT
	       : state == -EOPNOTSUPP ? ICPT_OFF
	       : state == -EBUSY      ? ICPT_YIELDED
	       : state == -ENODEV     ? ICPT_NO_DRIVER
				      : ICPT_UNPROVEN;
}

void gdr_stats_print(struct gdr_cache *c, const char *why)
{
	struct gdr_cache_stats st, *s = &st;
	struct gdr_intercept_stats is;
	enum icpt_state icpt_state = ICPT_UNKNOWN;
	char icpt[512], why_child[64], rank[32] = "";
	uint64_t exact_mrs, exact_replaced, old_cache;
	bool locked, child = c->stats_pid && c->stats_pid != (int)getpid();
	const struct gdr_ident *id = gdr_ident();

	/* A child of fork() inherits the parent's caches with their counts: its records say so, or
	 * whoever sums the records by pid counts the parent's registrations twice. */
	if (child) {
		snprintf(why_child, sizeof(why_child), "%s, child of fork", why);
		why = why_child;
	}
	old_cache = gdr_ident_cache_enter(c->id); /* the lines logged meanwhile: "cache=N" */

	/* Not waited for where this thread holds a cache lock (or waits for one): exit() from a
	 * signal handler (a program's SIGINT handler) that interrupted a registration runs the
	 * statistics at exit on this thread, whose lock it may be. Then the counters are read as they
	 * are. */
	locked = gdr_locks_held ? !pthread_mutex_trylock(&c->lock) : !pthread_mutex_lock(&c->lock);
	gdr_stats_collect(c, s);
	if (locked)
		pthread_mutex_unlock(&c->lock);
	exact_mrs = __atomic_load_n(&c->exact_mrs, __ATOMIC_RELAXED);
	exact_replaced = __atomic_load_n(&c->exact_replaced, __ATOMIC_RELAXED);
	gdr_hooks_stats_line(icpt, sizeof(icpt));
	/* The interception's numbers: libcuda was loaded by the cache's creation, so this loads
	 * nothing. Not asked in a child of fork() (the driver is unusable there, and its first
	 * probe would call it) nor under a cache's lock (it walks the caches' list). */
	memset(&is, 0, sizeof(is));
	if (!child && !gdr_locks_held && !gdr_intercept_get_stats(&is, sizeof(is)))
		icpt_state = icpt_state_of(is.state);

	const struct gdr_stat v[] = {
		{ "backend", c->backend->ops->name, 0 },
		{ "validate", c->validator->name, 0 },
		{ "cache_id", NULL, c->id },
		/* The text form's first line: from hits to overlap_split. */
		{ "hits", NULL, s->hits },
		{ "misses", NULL, s->misses },
		{ "stale", NULL, s->stale },
		{ "evictions", NULL, s->evictions },
		{ "pins", NULL, s->pins },
		{ "unpins", NULL, s->unpins },
		{ "pinned_bytes", NULL, s->pinned_bytes },
		{ "peak", NULL, s->pinned_bytes_peak },
		{ "entries", NULL, s->entries },
		{ "passthrough", NULL, s->passthrough },
		{ "tag_checks", NULL, s->tag_checks },
		{ "revoked", NULL, s->revoked },
		{ "sync_memops", NULL, s->sync_memops_set },
		{ "sync_memops_ctx", NULL, s->sync_memops_ctx },
		{ "sync_memops_unavailable", NULL, s->sync_memops_unavailable },
		{ "fail_pin", NULL, s->fail_pin },
		{ "fail_pin_retried", NULL, s->fail_pin_retried },
		{ "fail_mr", NULL, s->fail_mr },
		{ "fail_cuda", NULL, s->fail_cuda },
		{ "fail_input", NULL, s->fail_input },
		{ "refused_managed", NULL, s->refused_managed },
		{ "overlap_merged", NULL, s->overlap_merged },
		{ "detached", NULL, s->detached },
		{ "fast_hits", NULL, s->fast_hits },
		{ "events", NULL, s->events },
		{ "events_lost", NULL, s->events_lost },
		{ "overlap_split", NULL, s->overlap_split },
		/* Past this point the text form has lines of its own (below). */
		{ "exact_mrs", NULL, exact_mrs },
		{ "exact_replaced", NULL, exact_replaced },
		{ "interception", icpt, 0 },
		{ "intercept_state", NULL, icpt_state },
		{ "intercept_state_name", icpt_names[icpt_state], 0 },
		{ "intercept_errno", NULL, is.state < 0 ? (uint64_t)-is.state : 0 },
		/* Past this point: only where the state is known. */
		{ "intercept_frees_mem_free", NULL, is.frees[GDR_FREE_MEM_FREE] },
		{ "intercept_frees_mem_free_async", NULL, is.frees[GDR_FREE_MEM_FREE_ASYNC] },
		{ "intercept_frees_mem_free_host", NULL, is.frees[GDR_FREE_MEM_FREE_HOST] },
		{ "intercept_frees_mem_unmap", NULL, is.frees[GDR_FREE_MEM_UNMAP] },
		{ "intercept_frees_ipc_close", NULL, is.frees[GDR_FREE_IPC_CLOSE] },
		{ "intercept_frees_ctx", NULL, is.frees[GDR_FREE_CTX] },
		{ "intercept_released", NULL, is.released },
		{ "intercept_deferred", NULL, is.deferred },
		{ "intercept_reg_waits", NULL, is.reg_waits },
		{ "intercept_oom_relief", NULL, is.oom_relief },
		{ "intercept_oom_retry_ok", NULL, is.oom_retry_ok },
		{ "intercept_free_ns", NULL, is.free_ns },
		{ "intercept_own_releases", NULL, is.own_releases },
		{ "intercept_entries_short", NULL, is.entries_short },
		{ "intercept_entries_stopped", NULL, is.entries_stopped },
		{ "intercept_threads_stopped", NULL, is.threads_stopped },
		{ "intercept_threads_moved", NULL, is.threads_moved },
		{ "intercept_stopped_ns", NULL, is.stopped_ns },
	};
	const unsigned all = sizeof(v) / sizeof(v[0]), text_first = 3;
	unsigned text_end = 0, n = all;
	const struct gdr_output *o = gdr_config_output();
	bool text = o->stats_format == GDR_STATS_TEXT ||
		    (o->stats_format == GDR_STATS_AUTO && !o->stats_file[0]);

	for (unsigned i = 0; i < all; i++) {
		if (!strcmp(v[i].key, "exact_mrs"))
			text_end = i;
		if (icpt_state == ICPT_UNKNOWN && !strcmp(v[i].key, "intercept_frees_mem_free"))
			n = i;
	}
	if (!text) {
		gdr_stats_emit("cache", why, "gdrcache", "", v, n);
		gdr_ident_cache_leave(old_cache);
		return;
	}
	/* The text form: three lines (as they always were), one write; who wrote them first after the
	 * colon (scripts match "stats (WHY, backend" and "validate MODE):"). */
	{
		char stack[4096];
		struct buf b = { stack, 0, sizeof(stack) };
		int pid = (int)getpid();

		if (id && id->rank >= 0)
			snprintf(rank, sizeof(rank), " rank %d", id->rank);
		put(&b,
		    "gdrcache[%d] stats (%s, backend %s, validate %s): cache_id %" PRIu64
		    " host %s%s",
		    pid, why, c->backend->ops->name, c->validator->name, c->id,
		    id ? id->host : "unknown", rank);
		for (unsigned i = text_first; i < text_end; i++)
			put(&b, " %s %" PRIu64, v[i].key, v[i].num);
		put(&b,
		    "\ngdrcache[%d] remote-access MRs of exact ranges %" PRIu64
		    ", entries replaced "
		    "for holding too many %" PRIu64 "\ngdrcache[%d] interception: %s\n",
		    pid, exact_mrs, exact_replaced, pid, icpt);
		stats_write(o, &b);
	}
	gdr_ident_cache_leave(old_cache);
}

/* ---- Which caches, when --------------------------------------------------------------------- */

static void (*signal_fns[4])(const char *why);

int gdr_stats_on_signal(void (*fn)(const char *why))
{
	int rc = -ENOSPC;

	pthread_mutex_lock(&live_lock);
	for (unsigned i = 0; i < sizeof(signal_fns) / sizeof(signal_fns[0]); i++) {
		if (!signal_fns[i] || signal_fns[i] == fn) {
			signal_fns[i] = fn;
			rc = 0;
			break;
		}
	}
	pthread_mutex_unlock(&live_lock);
	return rc;
}

static bool exiting; /* under live_lock: the records at exit were written, no periodic one after */

static void print_live(const char *why, bool others)
{
	/* At exit on a thread that holds a cache lock (exit() from a signal handler, as in
	 * gdr_stats_print): the signal's thread may hold the list's lock, waiting for that cache
	 * lock. Then no records rather than a process that never exits. */
	if (gdr_locks_held ? pthread_mutex_trylock(&live_lock) : pthread_mutex_lock(&live_lock))
		return;
	if (exiting) {
		pthread_mutex_unlock(&live_lock);
		return;
	}
	for (struct gdr_cache *c = live; c; c = c->next_live)
		gdr_stats_print(c, why);
	for (unsigned i = 0; others && i < sizeof(signal_fns) / sizeof(signal_fns[0]); i++)
		if (signal_fns[i])
			signal_fns[i](why);
	pthread_mutex_unlock(&live_lock);
}

/* fork(): the signal thread prints with live_lock held, and the child has no such thread: without
 * this, a child forked meanwhile would wait forever at its destroy or at exit. */
void gdr_stats_fork_prepare(void)
{
	pthread_mutex_lock(&live_lock);
}

void gdr_stats_fork_done(void)
{
	pthread_mutex_unlock(&live_lock);
}

static void print_live_at_exit(void)
{
	print_live("at exit", false);
	/* The thread may wake while exit() goes on: its records would follow "at exit". Not waited
	 * for under a cache's lock, as print_live. */
	if (gdr_locks_held ? !pthread_mutex_trylock(&live_lock) : !pthread_mutex_lock(&live_lock)) {
		exiting = true;
		pthread_mutex_unlock(&live_lock);
	}
}

static int sig_pipe[2] = { -1, -1 };
static dev_t sig_dev; /* the pipe's, to know it again */
static ino_t sig_ino;
static struct sigaction sig_prev;
static pid_t sig_pid; /* the process whose thread reads the pipe (not a child of fork) */

/* Whether fd is still the pipe: a program that closes every descriptor from 3 up (daemons, job
 * launchers) and opens its own files may have one at the pipe's number, or put one there with
 * dup2 (a shell's exec 3>file under the preload). Neither the handler's byte goes into the
 * program's file, nor does the thread read the program's data (or spin on its end of file).
 * fstat is async-signal-safe. */
static bool sig_fd_ours(int fd)
{
	struct stat st;

	return !fstat(fd, &st) && st.st_dev == sig_dev && st.st_ino == sig_ino;
}

static void on_signal(int sig, siginfo_t *info, void *uc)
{
	int saved = errno;

	/* The read end too: open here, it is a reader, and the write cannot raise SIGPIPE (with only
	 * the read end's number replaced, the thread has ended: a write would kill the program). */
	if (getpid() == sig_pid && sig_fd_ours(sig_pipe[0]) && sig_fd_ours(sig_pipe[1]))
		(void)!write(sig_pipe[1], "s", 1); /* full: a dump is pending anyway */
	errno = saved;
	if ((sig_prev.sa_flags & SA_SIGINFO) && sig_prev.sa_sigaction)
		sig_prev.sa_sigaction(sig, info, uc);
	else if (!(sig_prev.sa_flags & SA_SIGINFO) && sig_prev.sa_handler != SIG_DFL &&
		 sig_prev.sa_handler != SIG_IGN)
		sig_prev.sa_handler(sig);
}

/* The program closed or replaced the signal's pipe: said once; always false. */
static bool pipe_gone(void)
{
	gdr_log_once(GDR_LOG_WARN, "GDRCACHE_STATS_SIGNAL: the program closed or replaced the "
				   "library's pipe: no statistics on the signal from now on");
	return false;
}

/* The thread: a byte in the pipe (the signal) writes the records of every live cache and the
 * preload's; so does each GDRCACHE_STATS_INTERVAL, timed on CLOCK_MONOTONIC (a late wake-up does
 * not make a burst: the next one is an interval later). Blocked in poll(2) in between. */
static void *stats_thread(void *arg)
{
	const uint64_t interval_ns = (uint64_t)gdr_config_output()->stats_interval * 1000000000u;
	bool pipe_ok = sig_pipe[0] >= 0;
	uint64_t next = mono_ns() + interval_ns;
	char bytes[64];

	(void)arg;
	for (;;) {
		struct pollfd pfd = { .fd = sig_pipe[0], .events = POLLIN };
		int timeout = -1, r;

		if (pipe_ok && !sig_fd_ours(sig_pipe[0]))
			pipe_ok = pipe_gone();
		if (!pipe_ok && !interval_ns)
			break;
		if (interval_ns) {
			uint64_t now = mono_ns();

			if (now >= next) {
				print_live("interval", true);
				next += interval_ns;
				if (next <= now)
					next = now + interval_ns;
				continue;
			}
			timeout = (next - now) / 1000000u + 1 > INT_MAX
					  ? INT_MAX
					  : (int)((next - now) / 1000000u + 1);
		}
		r = poll(pipe_ok ? &pfd : NULL, pipe_ok ? 1 : 0, timeout);
		if (r > 0) {
			/* never a read of the program's file put at the pipe's number */
			ssize_t n = sig_fd_ours(sig_pipe[0])
					    ? read(sig_pipe[0], bytes, sizeof(bytes))
					    : 0;

			if (n > 0)
				print_live("signal", true);
			else if (!n || (errno != EINTR && errno != EAGAIN))
				pipe_ok = pipe_gone(); /* the writer closed by the program */
		} else if (r < 0 && errno != EINTR) {
			gdr_err("the statistics thread: poll: %s: no statistics on the signal or the "
				"interval from now on",
				gdr_strerror(errno));
			break;
		}
	}
	return NULL;
}

/* The thread, once, if GDRCACHE_STATS_SIGNAL or GDRCACHE_STATS_INTERVAL asks for it; the handler
 * if the first does. */
static void signal_setup(void)
{
	const struct gdr_output *o = gdr_config_output();
	struct sigaction sa;
	struct stat st;
	sigset_t all, old;
	pthread_t t;
	int rc;

	if (!o->stats_signal && !o->stats_interval)
		return;
	gdr_thr_atfork_init(); /* the preload's records may come with no cache */
	if (o->stats_signal && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK)) {
		gdr_err("GDRCACHE_STATS_SIGNAL: pipe: %s: no statistics on the signal",
			gdr_strerror(errno));
		sig_pipe[0] = sig_pipe[1] = -1;
		if (!o->stats_interval)
			return;
	}
	if (sig_pipe[0] >= 0 && !fstat(sig_pipe[0], &st)) { /* both ends: one inode */
		sig_dev = st.st_dev;
		sig_ino = st.st_ino;
	}
	/* Both ends non-blocking: the handler must never block, and the thread reads only what
	 * poll(2) said is there. */
	sigfillset(&all);
	/* The thread takes none of the program's signals. */
	pthread_sigmask(SIG_SETMASK, &all, &old);
	rc = pthread_create(&t, NULL, stats_thread, NULL);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (rc) {
		gdr_err("GDRCACHE_STATS_SIGNAL / _INTERVAL: no thread (%s): no statistics on the "
			"signal or the interval",
			gdr_strerror(rc));
		return;
	}
	pthread_detach(t);
	sig_pid = getpid();
	if (!o->stats_signal || sig_pipe[0] < 0) {
		gdr_dbg("statistics every %u s", o->stats_interval);
		return;
	}
	/* Over a handler of the program's, the signal keeps that handler's flags and mask: without
	 * SA_RESTART the program has its blocking calls return EINTR on the signal, and a restart
	 * would leave them blocked. With no handler, the calls it interrupts are restarted: the
	 * program never asked for EINTR. */
	sigaction(o->stats_signal, NULL, &sig_prev);
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_signal;
	if ((sig_prev.sa_flags & SA_SIGINFO) ||
	    (sig_prev.sa_handler != SIG_DFL && sig_prev.sa_handler != SIG_IGN)) {
		sa.sa_flags =
			sig_prev.sa_flags & (SA_RESTART | SA_NODEFER | SA_ONSTACK | SA_RESETHAND);
		sa.sa_mask = sig_prev.sa_mask;
	} else {
		sa.sa_flags = SA_RESTART;
		sigemptyset(&sa.sa_mask);
	}
	sa.sa_flags |= SA_SIGINFO;
	sigaction(o->stats_signal, &sa, &sig_prev);
	gdr_dbg("statistics on signal %d", o->stats_signal);
}

/* No cancellation point acts in the setup (a debug line's write): cancelled after the handler was
 * installed, it would run again (pthread_once) and take its own handler for the program's, calling
 * itself on the signal for ever. */
static void signal_setup_once(void)
{
	int cancel;

	pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &cancel);
	signal_setup();
	pthread_setcancelstate(cancel, NULL);
}

static pthread_once_t signal_once = PTHREAD_ONCE_INIT;

/* For the preload: its records on the signal too (no cache needed). */
void gdr_stats_signal_setup(void)
{
	pthread_once(&signal_once, signal_setup_once);
}

void gdr_stats_track(struct gdr_cache *c)
{
	static bool registered;

	if (!c->cfg.stats)
		return;
	gdr_stats_signal_setup();
	c->stats_pid = (int)getpid();
	pthread_mutex_lock(&live_lock);
	if (!registered) {
		registered = true;
		atexit(print_live_at_exit);
	}
	c->next_live = live;
	live = c;
	pthread_mutex_unlock(&live_lock);
}

void gdr_stats_untrack(struct gdr_cache *c)
{
	if (!c->cfg.stats)
		return;
	pthread_mutex_lock(&live_lock);
	for (struct gdr_cache **p = &live; *p; p = &(*p)->next_live) {
		if (*p == c) {
			*p = c->next_live;
			break;
		}
	}
	pthread_mutex_unlock(&live_lock);
	gdr_stats_print(c, "destroy");
}
