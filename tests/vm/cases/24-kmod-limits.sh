#!/bin/sh
# SPDX-License-Identifier: MIT
# Limits (tests/kmod/kmod_harden_test.c): huge PIN lengths as root and as nobody (issue 10 #9),
# kernel memory charged to the memory cgroup (#13), /dev/gdrcache 0660, per-user and global caps
# with a clear error and a log line (#15).
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
grep -q ' /sys/fs/cgroup cgroup2 ' /proc/mounts || mount -t cgroup2 none /sys/fs/cgroup
rc=0
for t in len access memcg; do
	kmod_harden_test $t || rc=1
done
if ! dmesg | grep -q 'refused: max_user_pins=3 reached'; then
	echo "no log line for the per-user cap"
	rc=1
fi
# The module's totals (read-only parameters, what gdrcache_info reports): every pin given back.
for p in pins pinned_bytes; do
	v=$(cat /sys/module/gdrcache/parameters/$p 2>/dev/null)
	if [ "$v" != 0 ]; then
		echo "parameter $p is '$v' after every pin was given back (want 0)"
		rc=1
	fi
done
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
