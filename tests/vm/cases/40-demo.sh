#!/bin/sh
# SPDX-License-Identifier: MIT
# The README's demo: examples/gdr_rdma_demo on rxe0, "GPU" buffers from the fake CUDA driver declared
# to the simulated NVIDIA provider, pinned through gdrcache.ko, every payload verified. Two runs:
# small messages, where registration dominates, and 2 MiB buffers, whose frees the kernel module
# also reports to the library (a small buffer shares its driver chunk with others).
# Each run is asked for free events (-e): the case fails when a demo process validates its cache
# hits by BUFFER_ID queries instead, or when the interception missed one of the demo's cuMemFree
# calls. Speed is printed, not asserted.
# vm-timeout: 400
if ! command -v gdr_rdma_demo >/dev/null; then
	echo "gdr_rdma_demo absent"
	exit 77
fi
export LD_LIBRARY_PATH="$GDR_VM_FAKE_CUDA_DIR" FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
no_events=
demo() {
	gdr_rdma_demo -e -d "$GDR_VM_RXE_DEV" -g "${GDR_VM_GID:-1}" "$@"
	rc=$?
	case $rc in
	0) ;;
	3) no_events="$no_events, $*" ;;
	*) exit $rc ;;
	esac
}
demo -n 3000 -s 65536 -r 100
demo -n 300 -s 2097152 -r 30
if [ -n "$no_events" ]; then
	echo "40-demo: FAIL: free events were not in effect in gdr_rdma_demo (run with ${no_events#, }):"
	echo "  the cache validated its hits by BUFFER_ID queries (or missed a free); its"
	echo "  'validation:' line above says why"
	exit 1
fi
