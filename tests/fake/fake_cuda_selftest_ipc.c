/* SPDX-License-Identifier: MIT */
/*
 * Self-test of the fake CUDA driver, memory from another process (fake_cuda_ipc.c), as measured on
 * an H200: legacy CUDA IPC imports (no dma-buf export) and VMM POSIX-fd imports.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda_selftest.h"

void test_ipc(void)
{
	typedef struct {
		char reserved[64];
	} ipch_t;
	typedef CUresult (*getmh_t)(ipch_t *, CUdeviceptr);
	typedef CUresult (*openmh_t)(CUdeviceptr *, ipch_t, unsigned);
	typedef CUresult (*closemh_t)(CUdeviceptr);
	getmh_t getmh = (getmh_t)resolve("cuIpcGetMemHandle", 12000);
	openmh_t openmh = (openmh_t)resolve("cuIpcOpenMemHandle", 12000);
	closemh_t closemh = (closemh_t)resolve("cuIpcCloseMemHandle", 12000);
	ipch_t h;
	CUdeviceptr p = 0, p2 = 0, p3 = 0;
	CUcontext c = NULL;
	struct fake_cuda_alloc_info info = { 0 };
	unsigned one = 1;
	CUresult rc;

	fake_cuda_reset();
	uint64_t e = fake_cuda_alloc(3 * MIB);

	CHECK_EQ(getmh(&h, e), SUCCESS, "cuIpcGetMemHandle of cuMemAlloc memory");
	CHECK_EQ(openmh(&p, h, 1), SUCCESS, "cuIpcOpenMemHandle (the importer)");
	CHECK(p && p != e && bufid(p, &rc) != bufid(e, &rc) && rc == SUCCESS,
	      "IPC import: its own BUFFER_ID");
	p_cuPointerGetAttribute(&c, A_CONTEXT, p);
	CHECK(c == fake_cuda_context() && attr_u32(A_MEMORY_TYPE, p) == 2 &&
	      attr_u32(A_RDMA_CAPABLE, p) == 0,
	      "IPC import: CONTEXT the importer's, MEMORY_TYPE DEVICE, RDMA_CAPABLE 0");
	CHECK(attr_u64(A_RANGE_START, p + 100, NULL) == p && attr_u64(A_RANGE_SIZE, p, NULL) == 3 * MIB &&
	      attr_u64(A_MAPPING_BASE, p + 100, NULL) == p && attr_u64(A_MAPPING_SIZE, p, NULL) == 3 * MIB,
	      "IPC import: RANGE and MAPPING exactly the allocation");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, p), SUCCESS, "IPC import: SYNC_MEMOPS ok");
	CHECK_EQ(export_range(p, 2 * MIB, NULL), INVALID_VALUE, "IPC import: dma-buf export fails");
	CHECK(fake_cuda_alloc_info(p, &info) == 0 && info.kind == FAKE_CUDA_KIND_IPC, "kind IPC");
	unsigned long long id = bufid(p, &rc);

	CHECK(openmh(&p2, h, 1) == SUCCESS && p2 == p, "open twice: same VA");
	CHECK(closemh(p2) == SUCCESS && bufid(p, &rc) == id && rc == SUCCESS,
	      "close one of two: still valid");
	CHECK_EQ(closemh(p), SUCCESS, "close the last");
	bufid(p, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "closed: BUFFER_ID query INVALID_VALUE");
	CHECK(openmh(&p3, h, 1) == SUCCESS && p3 == p && bufid(p3, &rc) > id,
	      "reopen: same VA, new BUFFER_ID");
	closemh(p3);
	uint64_t i1 = fake_cuda_ipc_import(e), i2 = fake_cuda_ipc_import(e);

	CHECK(i1 && i1 == i2 && fake_cuda_ipc_close(i1) == 0 && fake_cuda_buffer_id(i1) &&
	      fake_cuda_ipc_close(i1) == 0 && !fake_cuda_buffer_id(i1) && fake_cuda_ipc_close(i1) == -EINVAL,
	      "fake_cuda_ipc_import / close: reference counted");

	ipch_t old = { { 0 } };
	uint64_t size = 8192;

	memcpy(old.reserved, &size, sizeof(size));
	CHECK(openmh(&p, old, 0) == SUCCESS && fake_cuda_alloc_info(p, &info) == 0 &&
	      info.kind == FAKE_CUDA_KIND_DEVICE && info.size == 8192 && closemh(p) == SUCCESS &&
	      !fake_cuda_buffer_id(p), "a hand-made handle: a fresh DEVICE allocation (kept)");
	fake_cuda_free(e);
}

void test_vmm_shareable(void)
{
	struct {
		int type, handle_types;
		struct {
			int type, id;
		} loc;
		void *win32;
		unsigned char flags[8];
	} prop = { 1, 1, { 1, 0 }, NULL, { 0 } };
	struct {
		struct {
			int type, id;
		} loc;
		int flags;
	} access = { { 1, 0 }, 3 };
	typedef CUresult (*create_t)(unsigned long long *, size_t, const void *, unsigned long long);
	typedef CUresult (*rel_t)(unsigned long long);
	typedef CUresult (*exp_t)(void *, unsigned long long, int, unsigned long long);
	typedef CUresult (*imp_t)(unsigned long long *, void *, int);
	typedef CUresult (*resv_t)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
	typedef CUresult (*afree_t)(CUdeviceptr, size_t);
	typedef CUresult (*map_t)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long);
	typedef CUresult (*acc_t)(CUdeviceptr, size_t, const void *, size_t);
	typedef CUresult (*unmap_t)(CUdeviceptr, size_t);
	create_t mcreate = (create_t)resolve("cuMemCreate", 12000);
	rel_t mrelease = (rel_t)resolve("cuMemRelease", 12000);
	exp_t mexport = (exp_t)resolve("cuMemExportToShareableHandle", 12000);
	imp_t mimport = (imp_t)resolve("cuMemImportFromShareableHandle", 12000);
	resv_t reserve = (resv_t)resolve("cuMemAddressReserve", 12000);
	afree_t afree = (afree_t)resolve("cuMemAddressFree", 12000);
	map_t map = (map_t)resolve("cuMemMap", 12000);
	acc_t setaccess = (acc_t)resolve("cuMemSetAccess", 12000);
	unmap_t unmap = (unmap_t)resolve("cuMemUnmap", 12000);
	unsigned long long hx = 0, hi = 0;
	CUdeviceptr va = 0;
	CUcontext c = (CUcontext)1;
	unsigned one = 1;
	int fd = -1;
	CUresult rc;

	fake_cuda_reset();
	CHECK_EQ(mcreate(&hx, 2 * MIB, &prop, 0), SUCCESS, "cuMemCreate (POSIX fd requested)");
	CHECK(mexport(&fd, hx, 1, 0) == SUCCESS && fd >= 0, "cuMemExportToShareableHandle: an fd");
	CHECK_EQ(mimport(&hi, (void *)(intptr_t)fd, 1), SUCCESS, "cuMemImportFromShareableHandle");
	CHECK(reserve(&va, 2 * MIB, 0, 0, 0) == SUCCESS && map(va, 2 * MIB, 0, hi, 0) == SUCCESS &&
	      setaccess(va, 2 * MIB, &access, 1) == SUCCESS, "importer: reserve, map, set access");
	unsigned long long id = bufid(va, &rc);

	p_cuPointerGetAttribute(&c, A_CONTEXT, va);
	CHECK(id && rc == SUCCESS && c == NULL, "VMM import: own BUFFER_ID, CONTEXT NULL");
	CHECK_EQ(p_cuPointerSetAttribute(&one, A_SYNC_MEMOPS, va), NOT_SUPPORTED,
		 "VMM import: SYNC_MEMOPS NOT_SUPPORTED");
	CHECK_EQ(export_range(va, 2 * MIB, NULL), SUCCESS, "VMM import: dma-buf export succeeds");
	CHECK_EQ(unmap(va, 2 * MIB), SUCCESS, "cuMemUnmap");
	bufid(va, &rc);
	CHECK_EQ(rc, INVALID_VALUE, "unmapped: BUFFER_ID query INVALID_VALUE");
	CHECK(map(va, 2 * MIB, 0, hi, 0) == SUCCESS && bufid(va, &rc) > id,
	      "remap of the same handle: new BUFFER_ID");
	unmap(va, 2 * MIB);
	CHECK_EQ(afree(va, 2 * MIB), SUCCESS, "cuMemAddressFree");
	prop.handle_types = 0;
	unsigned long long hn = 0;
	int fd2 = -1;

	CHECK(mcreate(&hn, 2 * MIB, &prop, 0) == SUCCESS && mexport(&fd2, hn, 1, 0) == INVALID_VALUE,
	      "export without the handle type requested: refused");
	CHECK(mrelease(hx) == SUCCESS && mrelease(hi) == SUCCESS && mrelease(hn) == SUCCESS &&
	      mrelease(hx) == INVALID_VALUE, "cuMemRelease");
	close(fd);
}
