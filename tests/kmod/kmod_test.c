// SPDX-License-Identifier: MIT
/* Helpers shared by the kernel-module test programs: TAP output, device wrappers. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kmod_test.h"

static int kt_n, kt_failed;

static int kt_report(int ok, const char *fmt, va_list ap)
{
	kt_n++;
	if (!ok)
		kt_failed++;
	printf("%sok %d - ", ok ? "" : "not ", kt_n);
	vprintf(fmt, ap);
	printf("\n");
	fflush(stdout);
	return ok;
}

int kt_check(int cond, const char *fmt, ...)
{
	va_list ap;
	int ok;

	va_start(ap, fmt);
	ok = kt_report(!!cond, fmt, ap);
	va_end(ap);
	return ok;
}

int kt_expect(long ret, long want, const char *fmt, ...)
{
	va_list ap;
	int ok;

	va_start(ap, fmt);
	ok = kt_report(ret == want, fmt, ap);
	va_end(ap);
	if (!ok)
		printf("#   got %ld (%s), want %ld (%s)\n", ret,
		       ret < 0 ? strerror((int)-ret) : "-", want,
		       want < 0 ? strerror((int)-want) : "-");
	return ok;
}

void kt_skip(const char *fmt, ...)
{
	va_list ap;

	kt_n++;
	printf("ok %d - # SKIP ", kt_n);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

void kt_diag(const char *fmt, ...)
{
	va_list ap;

	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

int kt_done(void)
{
	printf("1..%d\n", kt_n);
	if (kt_failed)
		printf("# %d of %d failed\n", kt_failed, kt_n);
	fflush(stdout);
	return kt_failed ? 1 : 0;
}

void kt_require_devices(void)
{
	if (access("/dev/gdrcache", F_OK) || access(NVP2P_SIM_DEVICE, F_OK)) {
		printf("1..0 # SKIP /dev/gdrcache or %s missing\n", NVP2P_SIM_DEVICE);
		exit(KT_SKIP);
	}
}

void *kt_gpu_mem(size_t len)
{
	size_t span = len + KT_GPU_PAGE;
	uintptr_t p, a;

	p = (uintptr_t)mmap(NULL, span, PROT_READ | PROT_WRITE,
			    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if ((void *)p == MAP_FAILED) {
		perror("mmap");
		exit(2);
	}
	a = (p + KT_GPU_PAGE - 1) & ~(uintptr_t)(KT_GPU_PAGE - 1);
	if (a > p)
		munmap((void *)p, a - p);
	if (p + span > a + len)
		munmap((void *)(a + len), p + span - (a + len));
	memset((void *)a, 0xa5, len);
	return (void *)a;
}

void kt_gpu_mem_free(void *p, size_t len)
{
	munmap(p, len);
}

int kt_ioctl(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) < 0 ? -errno : 0;
}

int kt_sim_open(void)
{
	int fd = open(NVP2P_SIM_DEVICE, O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		perror(NVP2P_SIM_DEVICE);
		exit(2);
	}
	return fd;
}

int kt_sim_alloc(int fd, void *va, size_t len, uint64_t *id)
{
	struct nvp2p_sim_alloc a = { .va = (uintptr_t)va, .len = len };
	int ret = kt_ioctl(fd, NVP2P_SIM_IOCTL_ALLOC, &a);

	if (!ret && id)
		*id = a.id;
	return ret;
}

int kt_sim_free(int fd, uint64_t id)
{
	struct nvp2p_sim_free f = { .id = id };

	return kt_ioctl(fd, NVP2P_SIM_IOCTL_FREE, &f);
}

int kt_sim_fault(int fd, uint32_t type, uint64_t value)
{
	struct nvp2p_sim_fault f = { .type = type, .value = value };

	return kt_ioctl(fd, NVP2P_SIM_IOCTL_SET_FAULT, &f);
}

int kt_sim_stats(int fd, struct nvp2p_sim_stats *s)
{
	memset(s, 0, sizeof(*s));
	return kt_ioctl(fd, NVP2P_SIM_IOCTL_GET_STATS, s);
}

int kt_sim_expect(int fd, unsigned long long pins, unsigned long long persistent,
		  unsigned long long allocations, const char *what)
{
	struct nvp2p_sim_stats s;

	kt_sim_stats(fd, &s);
	return kt_check(s.outstanding_pins == pins && s.outstanding_persistent == persistent &&
			s.allocations == allocations,
			"sim %s: %llu callback pins, %llu persistent, %llu allocations (want %llu, %llu, "
			"%llu)", what, (unsigned long long)s.outstanding_pins,
			(unsigned long long)s.outstanding_persistent,
			(unsigned long long)s.allocations, pins, persistent, allocations);
}

int kt_write_file(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC), ret = 0;

	if (fd < 0)
		return -errno;
	if (write(fd, s, strlen(s)) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

long long kt_read_num(const char *path)
{
	long long v = -1;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

int kt_set_param(const char *module, const char *param, const char *value)
{
	char path[256];

	snprintf(path, sizeof(path), "/sys/module/%s/parameters/%s", module, param);
	return kt_write_file(path, value);
}

unsigned long long kt_taint(void)
{
	long long v = kt_read_num("/proc/sys/kernel/tainted");

	return v < 0 ? 0 : (unsigned long long)v;
}

int kt_read_events(int fd, struct gdrcache_event *ev, size_t n)
{
	int fl = fcntl(fd, F_GETFL);
	ssize_t r;

	fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	r = read(fd, ev, n * sizeof(*ev));
	fcntl(fd, F_SETFL, fl);
	if (r < 0)
		return -errno;
	return (int)(r / sizeof(*ev));
}

int kt_gdr_open(void)
{
	int fd = open("/dev/gdrcache", O_RDWR | O_CLOEXEC);

	if (fd < 0) {
		perror("/dev/gdrcache");
		exit(2);
	}
	return fd;
}

int kt_gdr_drop_anchors(void)
{
	unsigned long lo[64], hi[64];
	char line[512];
	int n = 0, i;
	FILE *f = fopen("/proc/self/maps", "r");

	if (!f)
		return -errno;
	while (n < 64 && fgets(line, sizeof(line), f))
		if (strstr(line, "/dev/gdrcache") && sscanf(line, "%lx-%lx", &lo[n], &hi[n]) == 2)
			n++;
	fclose(f);
	for (i = 0; i < n; i++)
		if (munmap((void *)lo[i], hi[i] - lo[i]))
			return -errno;
	return n;
}

int kt_gdr_version(int fd, struct gdrcache_version *v)
{
	memset(v, 0, sizeof(*v));
	return kt_ioctl(fd, GDRCACHE_IOCTL_GET_VERSION, v);
}

int kt_gdr_pin(int fd, uint64_t va, uint64_t len, uint32_t flags, struct gdrcache_pin *out)
{
	struct gdrcache_pin p = { .va = va, .len = len, .flags = flags };
	int ret = kt_ioctl(fd, GDRCACHE_IOCTL_PIN, &p);

	if (out)
		*out = p;
	return ret;
}

int kt_gdr_unpin(int fd, uint64_t handle)
{
	struct gdrcache_unpin u = { .handle = handle };

	return kt_ioctl(fd, GDRCACHE_IOCTL_UNPIN, &u);
}

int kt_gdr_get_pages(int fd, uint64_t handle, uint64_t *pages, uint32_t max, uint32_t *count)
{
	struct gdrcache_get_pages g = {
		.handle = handle, .pages_ptr = (uintptr_t)pages, .max_pages = max,
	};
	int ret = kt_ioctl(fd, GDRCACHE_IOCTL_GET_PAGES, &g);

	if (count)
		*count = g.page_count;
	return ret;
}
