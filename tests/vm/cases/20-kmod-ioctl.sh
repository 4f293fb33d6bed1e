#!/bin/sh
# SPDX-License-Identifier: MIT
# gdrcache.ko's ioctl, mmap, read and poll ABI against the simulated NVIDIA provider (tests/kmod/kmod_ioctl_test.c)
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
kmod_ioctl_test
rc=$?
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
