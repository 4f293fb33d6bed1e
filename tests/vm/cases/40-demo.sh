#!/bin/sh
# SPDX-License-Identifier: MIT
# The README's demo: examples/gdr_rdma_demo on rxe0, "GPU" buffers from the fake CUDA driver declared
# to the simulated NVIDIA provider, pinned through gdrcache.ko, every payload verified. Two runs:
# small messages, where registration dominates, and 2 MiB buffers, whose frees the kernel module
# reports to the library (a small buffer shares its driver chunk, so only the tag check sees it).
# vm-timeout: 400
if ! command -v gdr_rdma_demo >/dev/null; then
	echo "gdr_rdma_demo absent"
	exit 77
fi
export LD_LIBRARY_PATH=$GDR_VM_FAKE_CUDA_DIR FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim
gdr_rdma_demo -d "$GDR_VM_RXE_DEV" -g "${GDR_VM_GID:-1}" -n 3000 -s 65536 -r 100 || exit $?
gdr_rdma_demo -d "$GDR_VM_RXE_DEV" -g "${GDR_VM_GID:-1}" -n 300 -s 2097152 -r 30
