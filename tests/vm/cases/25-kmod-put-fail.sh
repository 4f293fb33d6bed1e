#!/bin/sh
# SPDX-License-Identifier: MIT
# nvidia_p2p_put_pages fails (tests/kmod/kmod_harden_test.c, issue 10 #10): the region is orphaned,
# the free callback or a retry finishes it, a persistent pin is retried, and gdrcache.ko can not be
# unloaded meanwhile.
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
kmod_harden_test put-fail
rc=$?
if ! grep -q '^gdrcache ' /proc/modules; then
	echo "gdrcache.ko was unloaded with orphans: loading it again"
	insmod /lib/modules/extra/gdrcache.ko
	rc=1
fi
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
