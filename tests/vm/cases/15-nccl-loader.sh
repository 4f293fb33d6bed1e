#!/bin/sh
# SPDX-License-Identifier: MIT
# NCCL's route to the preload (no LD_PRELOAD): vm_nccl_loader loads its verbs as NCCL does
# (dlopen of NCCL_IBVERBS_LIB, else libibverbs.so, else libibverbs.so.1; dlvsym of each row of
# preload/nccl_verbs.h) and moves SEND/RECV and RDMA WRITE messages between "GPU" (fake CUDA) and
# host buffers on rxe0, registering them around every message. Once with NCCL_IBVERBS_LIB unset
# (libibverbs itself), once naming libgdrcache-preload.so: both exit 0 with 0 payloads wrong and
# the same counts; in the second the registration verbs are the preload's (dladdr) and its stats
# (GDRCACHE_STATS=1) show cached GPU registrations and cache hits; the first shows no preload.
# The control: NCCL_IBVERBS_LIB naming a library without the verbs (the fake libcuda) fails.
# vm-timeout: 240
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
if [ ! -f "$PRELOAD" ] || ! command -v vm_nccl_loader >/dev/null; then
	echo "libgdrcache-preload.so or vm_nccl_loader not built"
	exit 77
fi
export LD_LIBRARY_PATH="$GDR_VM_FAKE_CUDA_DIR" FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim GDRCACHE_STATS=1
unset LD_PRELOAD NCCL_IBVERBS_LIB
args="-d $GDR_VM_RXE_DEV -g ${GDR_VM_GID:-1} -n ${NCCL_LOADER_MESSAGES:-200} -s 65536"
summary() { grep '^vm_nccl_loader: NCCL_IBVERBS_LIB' "$1"; }
# "N messages (N SEND/RECV, N RDMA WRITE), N bytes, N payloads wrong; N GPU and N host
# registrations"
counts() { summary "$1" | sed -n 's/.*: \([0-9]* messages .* host registrations\);.*/\1/p'; }

# shellcheck disable=SC2086 # $args is split on purpose
vm_nccl_loader $args >plain.log 2>&1
rc=$?
cat plain.log
[ $rc -eq 77 ] && { echo "without the preload: skipped"; exit 77; }
[ $rc -eq 0 ] || { echo "libibverbs itself: exit $rc"; exit 1; }
summary plain.log | grep -q ', 0 payloads wrong;' ||
	{ echo "libibverbs itself: no clean summary"; exit 1; }
summary plain.log | grep -q 'ibv_reg_mr from libibverbs\.so.*ibv_dereg_mr from libibverbs\.so' ||
	{ echo "libibverbs itself: the registration verbs are not libibverbs'"; exit 1; }
! grep -q 'gdrcache-preload' plain.log ||
	{ echo "libibverbs itself: the preload was loaded"; exit 1; }

# shellcheck disable=SC2086
NCCL_IBVERBS_LIB=$PRELOAD vm_nccl_loader $args >preload.log 2>&1
rc=$?
cat preload.log
[ $rc -eq 0 ] || { echo "NCCL_IBVERBS_LIB=$PRELOAD: exit $rc"; exit 1; }
summary preload.log | grep -q ', 0 payloads wrong;' ||
	{ echo "through the preload: no clean summary"; exit 1; }
a=$(counts plain.log) b=$(counts preload.log)
if [ -z "$a" ] || [ "$a" != "$b" ]; then
	echo "counts differ: '$a' without, '$b' through the preload"
	exit 1
fi
for verb in ibv_reg_mr ibv_reg_mr_iova2 ibv_reg_dmabuf_mr ibv_dereg_mr; do
	summary preload.log | grep -q "[ ,]$verb from libgdrcache-preload\.so" ||
		{ echo "through the preload: $verb is not the preload's"; exit 1; }
done
grep -Eq 'gdrcache-preload\[[0-9]+\] stats: cached [1-9]' preload.log ||
	{ echo "the preload cached no GPU registration"; exit 1; }
grep -Eq 'gdrcache\[[0-9]+\] stats .*hits [1-9]' preload.log || { echo "no cache hits"; exit 1; }
! grep -Eq 'gdrcache-preload.*(error|warn)' preload.log || exit 1

# The control: a library that lacks the verbs is what NCCL would reject.
# shellcheck disable=SC2086
NCCL_IBVERBS_LIB=$GDR_VM_FAKE_CUDA_DIR/libcuda.so.1 vm_nccl_loader $args >control.log 2>&1
rc=$?
cat control.log
if [ $rc -ne 2 ] || ! grep -q 'ibv_get_device_list@IBVERBS_1.1 did not resolve' control.log; then
	echo "control: a library without the verbs was not refused (exit $rc)"
	exit 1
fi
summary plain.log
summary preload.log
grep -E 'gdrcache-preload\[[0-9]+\] stats: ' preload.log
