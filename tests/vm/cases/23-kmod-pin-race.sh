#!/bin/sh
# SPDX-License-Identifier: MIT
# PIN against its own races (tests/kmod/kmod_harden_test.c): another thread UNPINs the handle PIN is
# about to return (issue 10 #8); a free callback before PIN has read the page table (#14); the
# callback calls nvidia_p2p_free_page_table where it may sleep; GET_PAGES faulting on its buffer
# holds no lock that UNPIN needs.
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
rc=0
for t in "pin-race 5" pin-revoke free-table get-pages-fault; do
	# shellcheck disable=SC2086 # subtest and its argument
	kmod_harden_test $t || rc=1
done
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
