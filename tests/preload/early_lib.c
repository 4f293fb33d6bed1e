/* SPDX-License-Identifier: MIT */
/*
 * For early_prog.c: a library the program links, whose constructor (run before the preload's)
 * dlopens libibverbs and resolves its verbs with the process's dlvsym (the preload's, under
 * LD_PRELOAD).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <string.h>

struct verbs {
	void *get_device_list, *free_device_list, *open_device, *close_device, *alloc_pd,
		*dealloc_pd, *reg_mr, *dereg_mr;
};

typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static struct verbs early;
static void *handle;
static int done;

static void take(struct verbs *v, dlvsym_fn f, void *h)
{
	v->get_device_list = f(h, "ibv_get_device_list", "IBVERBS_1.1");
	v->free_device_list = f(h, "ibv_free_device_list", "IBVERBS_1.1");
	v->open_device = f(h, "ibv_open_device", "IBVERBS_1.1");
	v->close_device = f(h, "ibv_close_device", "IBVERBS_1.1");
	v->alloc_pd = f(h, "ibv_alloc_pd", "IBVERBS_1.1");
	v->dealloc_pd = f(h, "ibv_dealloc_pd", "IBVERBS_1.1");
	v->reg_mr = f(h, "ibv_reg_mr", "IBVERBS_1.1");
	v->dereg_mr = f(h, "ibv_dereg_mr", "IBVERBS_1.1");
}

__attribute__((constructor)) static void resolve_early(void)
{
	handle = dlopen("libibverbs.so.1", RTLD_NOW);
	if (!handle)
		return;
	take(&early, dlvsym, handle);
	done = 1;
}

__attribute__((visibility("default"))) int early_lib_verbs(struct verbs *e, void **h);
int early_lib_verbs(struct verbs *e, void **h)
{
	memcpy(e, &early, sizeof(early));
	*h = handle;
	return done;
}
