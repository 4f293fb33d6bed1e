#!/bin/sh
# SPDX-License-Identifier: MIT
# With no pin outstanding, gdrcache.ko and then nvp2p_sim.ko unload cleanly; both are loaded again
# for the cases after this one.
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
rc=0
rmmod gdrcache || { echo "rmmod gdrcache failed"; rc=1; }
rmmod nvp2p_sim || { echo "rmmod nvp2p_sim failed"; rc=1; }
grep -qE '^(gdrcache|nvp2p_sim) ' /proc/modules && { echo "still loaded:"; grep -E '^(gdrcache|nvp2p_sim) ' /proc/modules; rc=1; }
[ -e /dev/gdrcache ] && { echo "/dev/gdrcache still there"; rc=1; }
insmod /lib/modules/extra/nvp2p_sim.ko || { echo "insmod nvp2p_sim.ko failed"; rc=1; }
insmod /lib/modules/extra/gdrcache.ko || { echo "insmod gdrcache.ko failed"; rc=1; }
# devtmpfs makes the node soon after insmod: 10 s at most (TCG, a loaded host).
i=0
while [ $i -lt 100 ] && [ ! -c /dev/gdrcache ]; do sleep 0.1; i=$((i + 1)); done
[ -c /dev/gdrcache ] && [ -c /dev/nvp2p_sim ] || { echo "devices missing after reload (10 s after insmod)"; rc=1; }
ls -l /dev/gdrcache /dev/nvp2p_sim
grep -E '^(gdrcache|nvp2p_sim) ' /proc/modules
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
