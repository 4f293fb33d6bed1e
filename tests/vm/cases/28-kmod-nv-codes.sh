#!/bin/sh
# SPDX-License-Identifier: MIT
# gdrcache.ko against NVIDIA's real return codes and calling context (issue 15 item 1), as the
# simulator now follows NVIDIA's nv-p2p.c and p2p.c of 535 (tests/kmod/kmod_harden_test.c):
#   put-context  put_pages only works in the pinning process (from a kworker NVIDIA returns 0 and
#                releases nothing): an orphan is retried in its owner's context or ended by the
#                callback, never counted given back while NVIDIA holds it
#   get-errors   -EINVAL, -ENOMEM, -EIO, -ENOTSUPP, -EBUSY, -ENODEV from get_pages (callback and
#                persistent) reach PIN as clear errnos (-ENOTSUPP as -EOPNOTSUPP), nothing left behind
# vm-debug-pass: yes
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
rc=0
kmod_harden_test put-context || rc=1
kmod_harden_test get-errors || rc=1
if dmesg | grep -E 'Oops|WARNING:|BUG:|general protection|Call Trace'; then
	echo "the kernel complained during the case"
	exit 1
fi
exit $rc
