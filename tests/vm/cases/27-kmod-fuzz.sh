#!/bin/sh
# SPDX-License-Identifier: MIT
# A bounded-time ioctl fuzz of /dev/gdrcache, as root and as nobody, with provider faults
# (tests/kmod/kmod_fuzz.c): no oops, no WARN, no leaked pin. GDR_VM_FUZZ_SECONDS (default 20; 10
# under the debug pass).
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
secs=${GDR_VM_FUZZ_SECONDS:-20}
[ "$GDR_VM_DEBUG_PASS" = 1 ] && secs=${GDR_VM_FUZZ_SECONDS:-10}
kmod_fuzz -t "$secs" -s "$(date +%s)"
rc=$?
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
