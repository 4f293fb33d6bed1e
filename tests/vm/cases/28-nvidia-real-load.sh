#!/bin/sh
# SPDX-License-Identifier: MIT
# NVIDIA's real driver in the VM (issue 15 item 2): tests/nvidia/check-dkms.sh stages NVIDIA's
# proprietary nvidia.ko (535, built for this kernel) and gdrcache.ko as DKMS built it against that
# nvidia.ko's symbol versions. This case unloads the simulator (it exports the same nvidia_p2p_*
# names), tries to load NVIDIA's module in this GPU-less guest and records exactly what happens; then
# loads the DKMS-built gdrcache.ko, which must be refused while nvidia_p2p_* is missing (why it needs
# MODULE_SOFTDEP("pre: nvidia")), and puts the simulator and gdrcache.ko back.
# vm-timeout: 300
NV=/lib/modules/extra/nvidia.ko
GD=/lib/modules/extra/gdrcache-dkms.ko
if [ ! -f $NV ] || [ ! -f $GD ]; then
	echo "no real nvidia.ko staged (tests/nvidia/check-dkms.sh builds it as root): skip"
	exit 77
fi
rc=0
rmmod gdrcache || { echo "rmmod gdrcache failed"; rc=1; }
rmmod nvp2p_sim || { echo "rmmod nvp2p_sim failed"; rc=1; }
echo "modinfo: $(modinfo -F version $NV 2>/dev/null) $(ls -l $NV | awk '{print $5}') bytes"
# What nvidia.ko imports from the kernel's own modules (drm), staged in load order.
for dep in /lib/modules/extra/nvdep-*.ko; do
	[ -f "$dep" ] || continue
	insmod "$dep" && echo "loaded $(basename "$dep")" || { echo "insmod $(basename "$dep") failed"; rc=1; }
done
before=$(dmesg | wc -l)
out=$(insmod $NV 2>&1); nrc=$?
echo "insmod nvidia.ko: exit $nrc: $out"
dmesg | tail -n +$((before + 1)) | sed 's/^/  dmesg: /'
if [ $nrc -eq 0 ]; then
	echo "NVIDIA's module LOADED without a GPU"
	grep '^nvidia ' /proc/modules
	# Its P2P entry points then exist: gdrcache.ko (DKMS build) must load beside it.
	insmod $GD && echo "gdrcache-dkms.ko loaded beside nvidia.ko" || rc=1
	rmmod gdrcache; rmmod nvidia || rc=1
elif echo "$out" | grep -q 'No such device' && dmesg | tail -n +$((before + 1)) | grep -q 'NVRM: No NVIDIA GPU found'; then
	echo "as expected: NVIDIA's module refuses to load without an NVIDIA GPU (ENODEV)"
else
	echo "unexpected failure of NVIDIA's module"
	rc=1
fi
grep -q '^nvidia ' /proc/modules && { echo "nvidia still loaded"; rc=1; }
before=$(dmesg | wc -l)
out=$(insmod $GD 2>&1); grc=$?
echo "insmod gdrcache-dkms.ko without nvidia: exit $grc: $out"
dmesg | tail -n +$((before + 1)) | sed 's/^/  dmesg: /'
if [ $grc -eq 0 ]; then
	echo "gdrcache.ko loaded without NVIDIA's symbols"; rmmod gdrcache; rc=1
elif ! dmesg | tail -n +$((before + 1)) | grep -q 'Unknown symbol nvidia_p2p_'; then
	echo "refused, but not for nvidia_p2p_*"; rc=1
fi
for dep in $(ls -r /lib/modules/extra/nvdep-*.ko 2>/dev/null); do
	n=${dep##*/nvdep-??-}; rmmod "${n%.ko}" 2>/dev/null
done
insmod /lib/modules/extra/nvp2p_sim.ko || { echo "insmod nvp2p_sim.ko failed"; rc=1; }
insmod /lib/modules/extra/gdrcache.ko || { echo "insmod gdrcache.ko failed"; rc=1; }
# devtmpfs makes the node soon after insmod: 10 s at most (TCG, a loaded host).
i=0
while [ $i -lt 100 ] && [ ! -c /dev/gdrcache ]; do sleep 0.1; i=$((i + 1)); done
[ -c /dev/gdrcache ] || { echo "/dev/gdrcache missing after reload (10 s after insmod)"; rc=1; }
if dmesg | tail -n +$((before + 1)) | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
