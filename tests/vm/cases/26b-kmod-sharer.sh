#!/bin/sh
# SPDX-License-Identifier: MIT
# A process sharing the owner's descriptor table (clone(CLONE_FILES)) closes the last reference: the
# callback-mode pin must become an orphan, never freed with the callback armed; MADV_DOFORK refused.
# (tests/kmod/kmod_sharer_test.c; under the debug kernel too, where the freed region's reuse shows)
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
rc=0
kmod_sharer_test dofork || rc=1
kmod_sharer_test foreign-release ${SHARER_UAF:-uaf} || rc=1
dmesg | tail -60
exit $rc
