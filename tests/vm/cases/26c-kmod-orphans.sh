#!/bin/sh
# SPDX-License-Identifier: MIT
# Issue 31, items 9-12 (tests/kmod/kmod_harden_orphans.c, kmod_tail_check.c):
#   orphan-lock        another owner's orphans, and its put_pages, stall nobody else's ioctl (#9)
#   userns-caps        4 subordinate uids of one user share that user's caps (#10)
#   owner-exit-shared  the owner's exit gives back every pin while a clone(CLONE_FILES) sibling
#                      keeps its descriptor table (#11)
#   kmod_tail_check    the free callback drops its module reference by a tail jump (#12)
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
rc=0
skips=0
for t in orphan-lock userns-caps owner-exit-shared; do
	kmod_harden_test $t
	r=$?
	[ $r = 77 ] && skips=$((skips + 1))
	[ $r != 0 ] && [ $r != 77 ] && rc=1
done
kmod_tail_check /lib/modules/extra/gdrcache.ko
r=$?
[ $r = 77 ] && skips=$((skips + 1))
[ $r != 0 ] && [ $r != 77 ] && rc=1
if ! dmesg | grep -q 'uid 1000: pin of 65536 bytes refused: max_user_pins=2 reached'; then
	[ $skips = 0 ] && { echo "no log line naming the namespace's owner (uid 1000)"; rc=1; }
fi
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
