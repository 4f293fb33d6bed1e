/* SPDX-License-Identifier: MIT */
/*
 * An unversioned libibverbs.so.1 to link old_prog against, as programs were linked before
 * libibverbs versioned its symbols: old_prog's references then carry no version. Never loaded at
 * run time (old_prog runs against the real libibverbs, or the fake one); the bodies only abort.
 */
#include <stdlib.h>

#define STUB(name) void name(void); void name(void) { abort(); }
STUB(ibv_get_device_list)
STUB(ibv_free_device_list)
STUB(ibv_open_device)
STUB(ibv_close_device)
STUB(ibv_alloc_pd)
STUB(ibv_dealloc_pd)
STUB(ibv_reg_mr)
STUB(ibv_dereg_mr)
