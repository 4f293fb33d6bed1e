/* SPDX-License-Identifier: MIT */
/*
 * The negative control of the binding test: an interposer whose ibv_reg_mr carries a version node
 * of its own (WRONG_1.0, wrong_node.map). A program built against today's libibverbs refers to
 * ibv_reg_mr@IBVERBS_1.1 and must NOT bind here, which is why the preload uses libibverbs' nodes.
 */
#include <stddef.h>

__attribute__((visibility("default"))) void *ibv_reg_mr(void *pd, void *addr, size_t len,
							 int access);
void *ibv_reg_mr(void *pd, void *addr, size_t len, int access)
{
	(void)pd, (void)addr, (void)len, (void)access;
	return NULL;
}
