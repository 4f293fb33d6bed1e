#!/bin/sh
# SPDX-License-Identifier: MIT
# libgdrcache's kmod backend end to end: gdrcache.ko, the simulated provider and rxe0 (progs/vm_lib_kmod.c)
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ] || ! command -v vm_lib_kmod >/dev/null; then
	echo "modules or vm_lib_kmod absent"
	exit 77
fi
LD_LIBRARY_PATH=$GDR_VM_FAKE_CUDA_DIR FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim GDRCACHE_LOG=warn vm_lib_kmod
rc=$?
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
