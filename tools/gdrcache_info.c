/* SPDX-License-Identifier: MIT */
/*
 * gdrcache_info: what a process would get from libgdrcache on this machine, for operators and bug
 * reports (as ucx_info, fi_info): the library's version, the CUDA driver and its GPUs (each one's
 * name, PCI address, memory, BAR1, dma-buf and GPUDirect RDMA support), the free interception (the
 * real start-up probe), the backend and validation mode a cache gets and why not, gdrcache.ko
 * (loaded? version, parameters, pins), and with -c the effective configuration: every variable's
 * value, default, form and description, from the library's one table (lib/common/config.c), and
 * any test switch that is set. A malformed variable is named with the string given and the form
 * it must take.
 *
 * Usage: gdrcache_info [-c] [--json] | -h | --help | --version. Exit 0; 1 if a cache cannot be
 * created; 2 on an unknown option.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "common/json.h"
#include "cuda/cuda.h"
#include "intercept/hooks.h" /* gdr_driver_load */

#define DEVATTR_GPU_DIRECT_RDMA_SUPPORTED 116
#define DEVATTR_DMA_BUF_SUPPORTED 124

static const char usage_text[] =
	"usage: gdrcache_info [-c] [--json]\n"
	"       gdrcache_info -h | --help | --version\n"
	"What a process would get from libgdrcache on this machine: the library, the CUDA driver\n"
	"and its GPUs, the free interception, the cache's backend and validation, gdrcache.ko.\n"
	"  -c          also every GDRCACHE_* variable: value, default, form, description\n"
	"  --json      one JSON object instead of text (what a bug report should contain)\n"
	"  -h, --help  this text\n"
	"  --version   the library's version\n"
	"Exit status: 0; 1 when a cache cannot be created; 2 on an unknown option.\n";

/* ---- Output: text lines or one JSON document ------------------------------------------------ */

static bool json;
static struct gdr_json jw;
static char jbuf[256 << 10];
static int depth; /* text: sections open, for the indentation */

/* A section: a member holding an object (JSON), "name:" (text). NULL name (JSON only): an
 * element of an array. */
static void begin(const char *name)
{
	if (json) {
		if (name)
			gdr_json_key(&jw, name);
		gdr_json_object_begin(&jw);
	} else {
		printf("%*s%s:\n", 2 * depth, "", name);
	}
	depth++;
}

static void end(void)
{
	if (json)
		gdr_json_object_end(&jw);
	depth--;
}

static void text_line(const char *key, const char *val)
{
	printf("%*s%-*s %s\n", 2 * depth, "", 30 - 2 * depth, key, val);
}

static void out_str(const char *key, const char *val)
{
	if (json) {
		gdr_json_key(&jw, key);
		gdr_json_str(&jw, val);
	} else {
		text_line(key, val);
	}
}

static void out_strf(const char *key, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_strf(const char *key, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	out_str(key, buf);
}

static void out_i64(const char *key, int64_t v)
{
	char buf[24];

	if (json) {
		gdr_json_key(&jw, key);
		gdr_json_i64(&jw, v);
		return;
	}
	snprintf(buf, sizeof(buf), "%" PRId64, v);
	text_line(key, buf);
}

/* A size: bytes in JSON, MiB and bytes in text. */
static void out_bytes(const char *key, uint64_t v)
{
	char buf[48];

	if (json) {
		gdr_json_key(&jw, key);
		gdr_json_u64(&jw, v);
		return;
	}
	snprintf(buf, sizeof(buf), "%" PRIu64 " MiB (%" PRIu64 " bytes)", v >> 20, v);
	text_line(key, buf);
}

static void out_bool(const char *key, bool v)
{
	if (json) {
		gdr_json_key(&jw, key);
		gdr_json_bool(&jw, v);
	} else {
		text_line(key, v ? "yes" : "no");
	}
}

/* ---- Error numbers by name: the same in every locale, and what the headers call them --------- */

static const char *errno_name(int err)
{
	static const struct {
		int err;
		const char *name;
	} names[] = {
		{ EPERM, "EPERM" },           { ENOENT, "ENOENT" },
		{ EINTR, "EINTR" },           { EIO, "EIO" },
		{ ENXIO, "ENXIO" },           { EBADF, "EBADF" },
		{ EAGAIN, "EAGAIN" },         { ENOMEM, "ENOMEM" },
		{ EACCES, "EACCES" },         { EFAULT, "EFAULT" },
		{ EBUSY, "EBUSY" },           { EEXIST, "EEXIST" },
		{ ENODEV, "ENODEV" },         { EINVAL, "EINVAL" },
		{ ENOTTY, "ENOTTY" },         { ENOSPC, "ENOSPC" },
		{ ERANGE, "ERANGE" },         { ENAMETOOLONG, "ENAMETOOLONG" },
		{ ENOSYS, "ENOSYS" },         { EOVERFLOW, "EOVERFLOW" },
		{ EOPNOTSUPP, "EOPNOTSUPP" }, { ETIMEDOUT, "ETIMEDOUT" },
		{ ESTALE, "ESTALE" },         { ECANCELED, "ECANCELED" },
	};
	static char other[24];

	if (err < 0)
		err = -err;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].err == err)
			return names[i].name;
	snprintf(other, sizeof(other), "errno %d", err);
	return other;
}

/* ---- The sections ---------------------------------------------------------------------------- */

/* One GPU: what the driver tells of it; a field it does not tell is left out. */
static void gpu(int d, int (*get_name)(char *, int, int), int (*total_mem)(size_t *, int))
{
	int dmabuf, rdma;
	char name[256], pci[32], path[96], key[16];
	size_t mem;

	snprintf(key, sizeof(key), "gpu%d", d);
	begin(json ? NULL : key); /* JSON: an element of the array "gpus" */
	out_i64("index", d);
	if (get_name && !get_name(name, sizeof(name), d)) {
		name[sizeof(name) - 1] = '\0';
		out_str("name", name);
	}
	if (!gdr_cuda_device_pci(d, pci, sizeof(pci))) { /* as the default limits find them */
		uint64_t bar1;

		out_str("pci", pci);
		bar1 = gdr_cuda_pci_bar1(pci, path, sizeof(path));
		if (bar1)
			out_bytes("bar1", bar1);
	}
	if (total_mem && !total_mem(&mem, d))
		out_bytes("memory", mem);
	if (!gdr_cuda_device_attr(d, DEVATTR_DMA_BUF_SUPPORTED, &dmabuf))
		out_bool("dma_buf", dmabuf != 0);
	if (!gdr_cuda_device_attr(d, DEVATTR_GPU_DIRECT_RDMA_SUPPORTED, &rdma))
		out_bool("gpudirect_rdma", rdma != 0);
	end();
}

static void cuda(void)
{
	int (*drv_version)(int *), (*get_name)(char *, int, int), version = 0, n;
	int (*total_mem)(size_t *, int);
	const struct gdr_cuda_devices *f;
	void *h;

	begin("cuda");
	if (gdr_driver_load() || !(h = gdr_cuda_libcuda_handle())) {
		out_str("driver", "not loaded (no libcuda.so.1, or cuInit failed)");
		end();
		return;
	}
	out_str("driver", gdr_config_get()->libcuda);
	*(void **)&drv_version = dlsym(h, "cuDriverGetVersion");
	*(void **)&get_name = dlsym(h, "cuDeviceGetName");
	*(void **)&total_mem = dlsym(h, "cuDeviceTotalMem_v2");
	if (drv_version && !drv_version(&version))
		out_i64("driver_api_version", version);
	n = gdr_cuda_device_count();
	out_i64("devices", n);
	if (json) {
		gdr_json_key(&jw, "gpus");
		gdr_json_array_begin(&jw);
	}
	for (int d = 0; d < n && d < 64; d++)
		gpu(d, get_name, total_mem);
	if (json)
		gdr_json_array_end(&jw);
	/* What the library sized its default limits from (lib/cuda/devices.c). */
	f = gdr_cuda_devices();
	begin("pinnable");
	if (f->ndev) {
		out_bytes("bar1_total", f->bar1);
		out_bytes("memory_total", f->mem);
		out_bytes("total", f->pinnable);
		out_bytes("smallest_gpu", f->pinnable_min);
	}
	out_str("derived_from", f->why);
	end();
	end();
}

static void interception(void)
{
	struct gdr_intercept_stats is;

	begin("interception");
	if (gdr_intercept_get_stats(&is, sizeof(is)) == 0) {
		if (json) {
			out_i64("state", is.state);
			out_str("state_name", is.state ? "unavailable" : "proven");
			if (is.state)
				out_str("errno_name", errno_name(is.state));
			out_str("reason", is.reason);
		} else if (is.state) {
			out_strf("state", "unavailable: %s (%s)", is.reason, errno_name(is.state));
		} else {
			out_strf("state", "proven: %s", is.reason);
		}
	}
	end();
}

/* The first malformed variable (the one the library refuses caches for): its row of the table
 * (copied: var lives for the call only; its strings are the table's). */
static void malformed_one(const struct gdr_config_var *var, const char *value, bool set, void *arg)
{
	struct gdr_config_var *bad = arg;

	(void)value;
	(void)set;
	if (!bad->name && !strcmp(var->name, gdr_config_get()->bad))
		*bad = *var;
}

static bool malformed(struct gdr_config_var *bad)
{
	memset(bad, 0, sizeof(*bad));
	if (gdr_config_get()->bad)
		gdr_config_vars(malformed_one, bad);
	return bad->name != NULL;
}

static int cache(void)
{
	static const char *const backends[] = { "auto", "kmod", "dmabuf", "peermem" };
	struct gdr_config_var row;
	const struct gdr_config_var *bad;
	const char *given;
	struct gdr_cache_stats st;
	enum gdr_backend be;
	struct gdr_cache *c;
	int rc = gdr_cache_create(NULL, &c);

	begin("cache");
	if (rc) {
		bad = rc == -EINVAL && malformed(&row) ? &row : NULL;
		given = bad && getenv(bad->name) ? getenv(bad->name) : "";
		if (bad)
			out_strf("error",
				 "gdr_cache_create: %s (%d): %s=\"%s\" is malformed: it must be %s",
				 errno_name(rc), rc, bad->name, given, bad->form);
		else
			out_strf("error", "gdr_cache_create: %s (%d)", errno_name(rc), rc);
		if (json) {
			out_i64("errno", rc);
			out_str("errno_name", errno_name(rc));
		}
		if (json && bad) {
			begin("malformed");
			out_str("variable", bad->name);
			out_str("given", given);
			out_str("form", bad->form);
			end();
		}
		end();
		return 1;
	}
	gdr_cache_backend(c, &be);
	gdr_cache_get_stats(c, &st);
	out_str("backend", be <= GDR_BACKEND_PEERMEM ? backends[be] : "?");
	out_str("validation", st.validate_mode == GDR_VALIDATE_EVENTS ? "events" : "tag");
	gdr_cache_destroy(c);
	end();
	return 0;
}

static void module(void)
{
	char path[512], buf[256];
	struct dirent *de;
	FILE *f;
	DIR *d;

	begin("module");
	f = fopen("/sys/module/gdrcache/version", "r");
	d = opendir("/sys/module/gdrcache/parameters");
	if (!d && !f) {
		out_bool("loaded", false);
		out_str("device", gdr_config_get()->kmod_dev);
		end();
		return;
	}
	out_bool("loaded", true);
	if (f && fgets(buf, sizeof(buf), f)) {
		buf[strcspn(buf, "\n")] = '\0';
		out_str("version", buf);
	}
	if (f)
		fclose(f);
	while (d && (de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/sys/module/gdrcache/parameters/%s", de->d_name);
		f = fopen(path, "r");
		if (f && fgets(buf, sizeof(buf), f)) {
			buf[strcspn(buf, "\n")] = '\0';
			out_str(de->d_name, buf);
		}
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	end();
}

/* One row of the configuration table: every user variable; a test switch only when it is set (a
 * bug report must show it). The malformed one shows the string given: the library uses none. */
static void config_one(const struct gdr_config_var *var, const char *value, bool set, void *arg)
{
	const char *bad = gdr_config_get()->bad;
	bool malformed = bad && !strcmp(bad, var->name);

	(void)arg;
	if (var->test && !set)
		return;
	if (malformed)
		value = getenv(var->name);
	if (json) {
		begin(var->name);
		out_str("value", value);
		out_str("default", var->dflt);
		out_bool("set", set);
		out_bool("malformed", malformed);
		out_str("form", var->form);
		out_str("description", var->desc);
		if (var->test)
			out_bool("test", true);
		end();
	} else if (malformed) {
		printf("  %-24s \"%s\" is MALFORMED: it must be %s (default %s)\n", var->name,
		       value, var->form, var->dflt);
		printf("  %-24s %s\n", "", var->desc);
	} else {
		printf("  %-24s %-12s (%sdefault %s%s; %s)\n", var->name, value,
		       var->test ? "a test switch, " : "", var->dflt, set ? ", set" : "",
		       var->form);
		printf("  %-24s %s\n", "", var->desc);
	}
}

int main(int argc, char **argv)
{
	bool conf = false;
	int rc;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--json")) {
			json = true;
		} else if (!strcmp(argv[i], "-c")) {
			conf = true;
		} else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage_text, stdout);
			return 0;
		} else if (!strcmp(argv[i], "--version")) {
			printf("gdrcache_info %u.%u.%u\n", gdr_cache_version() >> 16,
			       (gdr_cache_version() >> 8) & 0xff, gdr_cache_version() & 0xff);
			return 0;
		} else {
			fprintf(stderr, "gdrcache_info: unknown option %s\n%s", argv[i],
				usage_text);
			return 2;
		}
	}
	gdr_json_init(&jw, jbuf, sizeof(jbuf));
	if (json)
		gdr_json_object_begin(&jw);
	begin("library");
	out_strf("version", "%u.%u.%u", gdr_cache_version() >> 16,
		 (gdr_cache_version() >> 8) & 0xff, gdr_cache_version() & 0xff);
	end();
	cuda();
	interception();
	rc = cache();
	module();
	if (conf || json) {
		begin("config");
		gdr_config_vars(config_one, NULL);
		end();
	}
	if (json) {
		gdr_json_object_end(&jw);
		if (!gdr_json_ok(&jw)) {
			fprintf(stderr,
				"gdrcache_info: the JSON document needs %zu bytes, more than "
				"the %zu it has\n",
				jw.len, sizeof(jbuf));
			return 1;
		}
		printf("%s\n", jbuf);
	}
	return rc;
}
