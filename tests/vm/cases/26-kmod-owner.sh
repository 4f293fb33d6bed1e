#!/bin/sh
# SPDX-License-Identifier: MIT
# Pins do not outlive their owner (tests/kmod/kmod_harden_test.c, issue 10 #11): the file passed
# over SCM_RIGHTS, inherited by fork(), the revocation area not inherited, close() while mapped;
# and the owner can not be impersonated by a new process with its pid (#12).
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
rc=0
for t in owner identity; do
	kmod_harden_test $t || rc=1
done
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
