#!/bin/sh
# SPDX-License-Identifier: MIT
# examples/naive_gpu_verbs (plain verbs: ibv_reg_mr/ibv_dereg_mr of both "GPU" buffers around every
# message, SEND/RECV, every payload verified, buffers freed and reallocated at the same addresses
# every 100 messages) on rxe0, "GPU" memory from the fake CUDA driver declared to the simulated
# NVIDIA provider: first as it is, then under LD_PRELOAD=libgdrcache-preload.so (cache through
# gdrcache.ko when it is loaded). Both must verify every payload; the preloaded run must have been
# served by the cache (GDRCACHE_STATS=1). The control: -S keeps the send MR across reallocations
# (the bug a cache without validation would have) and the receiver must see wrong payloads.
# 64 KiB and 4 KiB messages; prints message rates and registration time per message, and ratios.
# vm-timeout: 500
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
if [ ! -f "$PRELOAD" ] || ! command -v naive_gpu_verbs >/dev/null; then
	echo "libgdrcache-preload.so or naive_gpu_verbs not built"
	exit 77
fi
export LD_LIBRARY_PATH=$GDR_VM_FAKE_CUDA_DIR FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim
base="-d $GDR_VM_RXE_DEV -g ${GDR_VM_GID:-1} -n ${NAIVE_MESSAGES:-2000} -r 100"
rate() { sed -n 's/^naive_gpu_verbs: \([0-9]*\) messages\/s.*/\1/p' "$1"; }
reg() { sed -n 's/^naive_gpu_verbs: .* \([0-9.]*\) us registering.*/\1/p' "$1"; }
ratio() { awk "BEGIN { printf \"%.2f\", $1 / $2 }"; }

# One message size without and with the preload; prints the figures.
compare() {
	size=$1
	# shellcheck disable=SC2086 # $base is split on purpose
	naive_gpu_verbs $base -s "$size" >plain-$size.log 2>&1
	rc=$?
	cat plain-$size.log
	[ $rc -eq 0 ] || { echo "$size bytes without the preload: exit $rc"; return 1; }
	grep -q ', 0 payloads wrong' plain-$size.log || return 1

	# shellcheck disable=SC2086
	LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1 naive_gpu_verbs $base -s "$size" >preload-$size.log 2>&1
	rc=$?
	cat preload-$size.log
	[ $rc -eq 0 ] || { echo "$size bytes with the preload: exit $rc"; return 1; }
	grep -q ', 0 payloads wrong' preload-$size.log || return 1
	! grep -q ', 0 at the same addresses' preload-$size.log ||
		{ echo "no reallocation at the same address: the stale-MR check was not exercised"; return 1; }
	grep -Eq 'gdrcache-preload\[[0-9]+\] stats: cached [1-9]' preload-$size.log ||
		{ echo "the preload served nothing from the cache"; return 1; }
	grep -Eq 'gdrcache\[[0-9]+\] stats .*hits [1-9]' preload-$size.log ||
		{ echo "no cache hits"; return 1; }
	grep -Eq 'gdrcache\[[0-9]+\] stats .* stale [1-9]' preload-$size.log ||
		{ echo "the cache never saw a freed buffer's entry go stale"; return 1; }
	p=$(rate plain-$size.log) c=$(rate preload-$size.log)
	rp=$(reg plain-$size.log) rc=$(reg preload-$size.log)
	echo "naive_gpu_verbs $size bytes: $p messages/s without, $c with the preload (x$(ratio "$c" "$p")); registration $rp us without, $rc us with per message (x$(ratio "$rp" "$rc") cheaper)"
}
compare 65536 >summary.log || { cat summary.log; exit 1; }
compare 4096 >>summary.log || { cat summary.log; exit 1; }
cat summary.log

# The control: the verification catches a stale MR.
# shellcheck disable=SC2086
naive_gpu_verbs $base -s 65536 -S >stale.log 2>&1
rc=$?
cat stale.log
[ $rc -eq 1 ] && ! grep -q ', 0 payloads wrong' stale.log ||
	{ echo "control: a stale MR was not caught (exit $rc)"; exit 1; }
grep '^naive_gpu_verbs .* bytes:' summary.log
