/* SPDX-License-Identifier: MIT */
/*
 * The verbs NCCL resolves from the library it dlopens (NCCL_IBVERBS_LIB, else libibverbs.so, else
 * libibverbs.so.1), each with dlvsym(handle, name, version): the route "NCCL_IBVERBS_LIB pointed
 * at libgdrcache-preload.so" must answer every one of them (preload/README.md, "NCCL_IBVERBS_LIB
 * and UCCL_IBV_SO"; tests/preload/nccl_loader_prog.c checks it row by row).
 *
 * From NCCL 2.30.7 (github.com/NVIDIA/nccl, commit 5067397c, makefiles/version.mk),
 * src/misc/ibvsymbols.cc, its dynamic-loading mode (built without NCCL_BUILD_RDMA_CORE):
 *   REQUIRED  LOAD_SYM at IBVERBS_1.1: a lookup that fails makes NCCL drop the IB transport
 *   OPTIONAL  LOAD_SYM_VERSION at a later node: a lookup that fails leaves the pointer NULL
 *             quietly, and NCCL takes the feature as absent (ibv_reg_dmabuf_mr: no DMA-BUF)
 * 27 rows, in NCCL's order. To refresh: read buildIbvSymbols() in that file (and the struct
 * ncclIbvSymbols of src/include/ibvsymbols.h for new members), one row per LOAD_SYM or
 * LOAD_SYM_VERSION, and update the version above.
 *
 * GDRP_NCCL_VERBS(X) expands X(name, "version node", REQUIRED | OPTIONAL) for each row.
 */
#ifndef GDR_PRELOAD_NCCL_VERBS_H
#define GDR_PRELOAD_NCCL_VERBS_H

/* clang-format off */
#define GDRP_NCCL_VERBS(X)                                                                         \
	X(ibv_get_device_list,  "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_free_device_list, "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_get_device_name,  "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_open_device,      "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_close_device,     "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_get_async_event,  "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_ack_async_event,  "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_query_device,     "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_query_port,       "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_query_gid,        "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_query_qp,         "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_alloc_pd,         "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_dealloc_pd,       "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_reg_mr,           "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_reg_mr_iova2,     "IBVERBS_1.8",  OPTIONAL)                                          \
	X(ibv_reg_dmabuf_mr,    "IBVERBS_1.12", OPTIONAL)                                          \
	X(ibv_dereg_mr,         "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_create_cq,        "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_destroy_cq,       "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_create_qp,        "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_modify_qp,        "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_destroy_qp,       "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_fork_init,        "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_event_type_str,   "IBVERBS_1.1",  REQUIRED)                                          \
	X(ibv_query_ece,        "IBVERBS_1.10", OPTIONAL)                                          \
	X(ibv_set_ece,          "IBVERBS_1.10", OPTIONAL)                                          \
	X(ibv_query_port_speed, "IBVERBS_1.16", OPTIONAL)
/* clang-format on */

#endif /* GDR_PRELOAD_NCCL_VERBS_H */
