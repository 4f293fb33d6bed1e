/* SPDX-License-Identifier: MIT */
/*
 * gdrcache_info: what a process would get from libgdrcache on this machine, for operators and bug
 * reports (as ucx_info, fi_info): the library's version, the CUDA driver and its GPUs (dma-buf and
 * GPUDirect RDMA support), the free interception (the real start-up probe), the backend and
 * validation mode a cache gets and why, gdrcache.ko (loaded? version, parameters, pins), and with
 * -c the effective configuration: every variable's value, default, form and description, from the
 * library's one table (lib/common/config.c), and any test switch that is set.
 *
 * Usage: gdrcache_info [-c] [--json]. Exit 0; 1 if a cache cannot be created.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config.h"
#include "cuda/cuda.h"

#define DEVATTR_GPU_DIRECT_RDMA_SUPPORTED 116
#define DEVATTR_DMA_BUF_SUPPORTED 124

static bool json;
static int nfields; /* fields written in the current JSON object */

/* A JSON string, quoted and escaped. */
static void json_str(const char *val)
{
	putchar('"');
	for (const char *p = val; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if ((unsigned char)*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}

/* One value, as "key: value" or a JSON member. */
static void field(const char *key, const char *val, bool str)
{
	if (!json) {
		printf("  %-28s %s\n", key, val);
		return;
	}
	printf("%s\"%s\": ", nfields++ ? ", " : "", key);
	if (str)
		json_str(val);
	else
		printf("%s", val);
}

static void fieldf(const char *key, bool str, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void fieldf(const char *key, bool str, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	field(key, buf, str);
}

static void section(const char *name)
{
	if (json)
		printf("%s\"%s\": {", nfields++ ? ", " : "", name);
	else
		printf("%s:\n", name);
	if (json)
		nfields = 0;
}

static void end_section(void)
{
	if (json) {
		printf("}");
		nfields = 1;
	}
}

static void cuda(void)
{
	int (*drv_version)(int *), (*dev_count)(int *), version = 0, n = 0;
	void *h;

	section("cuda");
	if (gdr_cuda_load() || !(h = gdr_cuda_libcuda_handle())) {
		field("driver", "not loaded (no libcuda.so.1, or cuInit failed)", true);
		end_section();
		return;
	}
	field("driver", gdr_config_get()->libcuda, true);
	*(void **)&drv_version = dlsym(h, "cuDriverGetVersion");
	*(void **)&dev_count = dlsym(h, "cuDeviceGetCount");
	if (drv_version && !drv_version(&version))
		fieldf("driver_api_version", false, "%d", version);
	if (dev_count && !dev_count(&n))
		fieldf("devices", false, "%d", n);
	for (int d = 0; d < n && d < 64; d++) {
		int dmabuf = -1, rdma = -1;
		char key[32];

		gdr_cuda_device_attr(d, DEVATTR_DMA_BUF_SUPPORTED, &dmabuf);
		gdr_cuda_device_attr(d, DEVATTR_GPU_DIRECT_RDMA_SUPPORTED, &rdma);
		snprintf(key, sizeof(key), "device%d", d);
		fieldf(key, true, "dma_buf %s, gpudirect_rdma %s",
		       dmabuf < 0 ? "?"
		       : dmabuf   ? "yes"
				  : "no",
		       rdma < 0 ? "?"
		       : rdma   ? "yes"
				: "no");
	}
	end_section();
}

static void interception(void)
{
	struct gdr_intercept_stats is;

	section("interception");
	if (gdr_intercept_get_stats(&is, sizeof(is)) == 0) {
		fieldf("state", false, "%d", is.state);
		field("reason", is.reason, true);
	}
	end_section();
}

static int cache(void)
{
	static const char *const backends[] = { "auto", "kmod", "dmabuf", "peermem" };
	struct gdr_cache_stats st;
	enum gdr_backend be;
	struct gdr_cache *c;
	int rc = gdr_cache_create(NULL, &c);

	section("cache");
	if (rc) {
		fieldf("error", true, "gdr_cache_create: %s (%d)", strerror(-rc), rc);
		end_section();
		return 1;
	}
	gdr_cache_backend(c, &be);
	gdr_cache_get_stats(c, &st);
	field("backend", be <= GDR_BACKEND_PEERMEM ? backends[be] : "?", true);
	field("validation", st.validate_mode == GDR_VALIDATE_EVENTS ? "events" : "tag", true);
	gdr_cache_destroy(c);
	end_section();
	return 0;
}

static void module(void)
{
	char path[512], buf[256];
	struct dirent *de;
	FILE *f;
	DIR *d;

	section("module");
	f = fopen("/sys/module/gdrcache/version", "r");
	d = opendir("/sys/module/gdrcache/parameters");
	if (!d && !f) {
		field("loaded", "false", false);
		field("device", gdr_config_get()->kmod_dev, true);
		end_section();
		return;
	}
	field("loaded", "true", false);
	if (f && fgets(buf, sizeof(buf), f)) {
		buf[strcspn(buf, "\n")] = '\0';
		field("version", buf, true);
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
			field(de->d_name, buf, true);
		}
		if (f)
			fclose(f);
	}
	if (d)
		closedir(d);
	end_section();
}

/* One row of the configuration table: every user variable; a test switch only when it is set (a
 * bug report must show it). */
static void config_one(const struct gdr_config_var *var, const char *value, bool set, void *arg)
{
	(void)arg;
	if (var->test && !set)
		return;
	if (json) {
		printf("%s\"%s\": {\"value\": ", nfields++ ? ", " : "", var->name);
		json_str(value);
		printf(", \"default\": ");
		json_str(var->dflt);
		printf(", \"set\": %s, \"form\": ", set ? "true" : "false");
		json_str(var->form);
		printf(", \"description\": ");
		json_str(var->desc);
		if (var->test)
			printf(", \"test\": true");
		printf("}");
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
		if (!strcmp(argv[i], "--json"))
			json = true;
		else if (!strcmp(argv[i], "-c"))
			conf = true;
		else {
			fprintf(stderr, "usage: gdrcache_info [-c] [--json]\n");
			return 2;
		}
	}
	if (json)
		printf("{");
	section("library");
	fieldf("version", true, "%u.%u.%u", gdr_cache_version() >> 16,
	       (gdr_cache_version() >> 8) & 0xff, gdr_cache_version() & 0xff);
	end_section();
	cuda();
	interception();
	rc = cache();
	module();
	if (conf || json) {
		section("config");
		gdr_config_vars(config_one, NULL);
		end_section();
	}
	if (json)
		printf("}\n");
	return rc;
}
