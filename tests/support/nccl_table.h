/* SPDX-License-Identifier: MIT */
/*
 * NCCL's verbs table as the test programs that load verbs the NCCL way use it
 * (tests/preload/nccl_loader_prog.c, tests/vm/progs/vm_nccl_loader.c): the row indices of
 * preload/nccl_verbs.h, and typed pointers for the rows they call, filled from the addresses the
 * loader found (NCCL_TABLE_FILL).
 */
#ifndef GDR_TESTS_NCCL_TABLE_H
#define GDR_TESTS_NCCL_TABLE_H

#include <infiniband/verbs.h>

#include "nccl_verbs.h"

enum { OPTIONAL, REQUIRED };

#define NCCL_TABLE_IDX(name, version, kind) R_##name,
enum { GDRP_NCCL_VERBS(NCCL_TABLE_IDX) R_N };
#undef NCCL_TABLE_IDX

struct nccl_table {
	struct ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct ibv_device **);
	const char *(*get_device_name)(struct ibv_device *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	int (*close_device)(struct ibv_context *);
	int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
	int (*query_port)(struct ibv_context *, uint8_t, struct ibv_port_attr *);
	int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
	int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	int (*dealloc_pd)(struct ibv_pd *);
	struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
	struct ibv_mr *(*reg_mr_iova2)(struct ibv_pd *, void *, size_t, uint64_t, unsigned int);
	int (*dereg_mr)(struct ibv_mr *);
	struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *,
				    int);
	int (*destroy_cq)(struct ibv_cq *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
	const char *(*event_type_str)(enum ibv_event_type);
};

/* t's pointers from rows[R_<name>].field (the address found for each row). */
#define NCCL_TABLE_FN_(t, rows, field, member)                                                     \
	(*(void **)&(t).member = (rows)[R_ibv_##member].field)
#define NCCL_TABLE_FILL(t, rows, field)                                                            \
	do {                                                                                       \
		NCCL_TABLE_FN_(t, rows, field, get_device_list);                                   \
		NCCL_TABLE_FN_(t, rows, field, free_device_list);                                  \
		NCCL_TABLE_FN_(t, rows, field, get_device_name);                                   \
		NCCL_TABLE_FN_(t, rows, field, open_device);                                       \
		NCCL_TABLE_FN_(t, rows, field, close_device);                                      \
		NCCL_TABLE_FN_(t, rows, field, query_device);                                      \
		NCCL_TABLE_FN_(t, rows, field, query_port);                                        \
		NCCL_TABLE_FN_(t, rows, field, query_gid);                                         \
		NCCL_TABLE_FN_(t, rows, field, query_qp);                                          \
		NCCL_TABLE_FN_(t, rows, field, alloc_pd);                                          \
		NCCL_TABLE_FN_(t, rows, field, dealloc_pd);                                        \
		NCCL_TABLE_FN_(t, rows, field, reg_mr);                                            \
		NCCL_TABLE_FN_(t, rows, field, reg_mr_iova2);                                      \
		NCCL_TABLE_FN_(t, rows, field, dereg_mr);                                          \
		NCCL_TABLE_FN_(t, rows, field, create_cq);                                         \
		NCCL_TABLE_FN_(t, rows, field, destroy_cq);                                        \
		NCCL_TABLE_FN_(t, rows, field, create_qp);                                         \
		NCCL_TABLE_FN_(t, rows, field, modify_qp);                                         \
		NCCL_TABLE_FN_(t, rows, field, destroy_qp);                                        \
		NCCL_TABLE_FN_(t, rows, field, event_type_str);                                    \
	} while (0)

#endif /* GDR_TESTS_NCCL_TABLE_H */
