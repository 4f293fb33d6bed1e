#!/bin/sh
# SPDX-License-Identifier: MIT
# processes SIGKILLed while holding pins give every pin back (tests/kmod/kmod_kill_test.c)
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
kmod_kill_test 100
rc=$?
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
