#!/bin/sh
# SPDX-License-Identifier: MIT
# free callbacks racing with UNPIN, thousands of rounds, callback delay injected (tests/kmod/kmod_race_stress.c)
# vm-timeout: 300
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
# Fewer rounds under the debug pass's slower kernel (slub_debug).
rounds=3000
[ "$GDR_VM_DEBUG_PASS" = 1 ] && rounds=1000
kmod_race_stress -i $rounds -p 4 -k 4 -d 50
rc=$?
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
