#!/bin/bash
# SPDX-License-Identifier: MIT
# Issue 36 on the GPU machine (no NIC: the fake libibverbs of tests/preload stands in for it), in
# one run of about a minute:
#   - the patcher on this libcuda: tests/gpu/probes/entry_bytes.c (cuMemGetHandleForAddressRange's
#     entry among entries.h's rows)
#   - bench_dmabuf nccl / sub 1000 / sub 10000, without the preload and with it, side by side;
#     bench_dmabuf free under the preload (the real driver's frees and reused addresses)
#   - tests/gpu's test_gpu (the library's own GPU checks) with the new export hook in place
# Built beforehand on the development machine and carried (build/gpupre):
#   cmake -S . -B build/gpupre -DCMAKE_BUILD_TYPE=Release -DGDR_BUILD_EXAMPLES=OFF &&
#   cmake --build build/gpupre -j2 --target bench_dmabuf gdrcache_preload gdr_fake_ibverbs test_gpu
# Output: $OUT/dmabuf.txt (everything).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GDR_BUILD:-$ROOT/build/gpupre}
OUT=${OUT:-$ROOT/out-gpu}
mkdir -p "$OUT"
FAKE=$B/tests/preload/fakeverbs
PRE=$B/lib/libgdrcache-preload.so
rc_all=0
run() { # name, command...
	local name=$1 rc
	shift
	timeout 300 "$@"
	rc=$?
	echo "## $name: exit $rc"
	[ $rc = 0 ] || [ $rc = 77 ] || rc_all=1
}
{
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); $(nproc) CPUs; kernel $(uname -r)"
	gcc -O1 -o "$OUT/entry_bytes" "$ROOT/tests/gpu/probes/entry_bytes.c" -ldl &&
		run entry_bytes "$OUT/entry_bytes" | head -40
	for mode in nccl "sub 1000" "sub 10000"; do
		echo
		echo "===== bench_dmabuf $mode: without the preload (the fake libibverbs directly)"
		# shellcheck disable=SC2086 # mode: two words
		LD_LIBRARY_PATH=$FAKE:$B/lib run "bench $mode, direct" "$B/bench/bench_dmabuf" $mode
		echo "===== bench_dmabuf $mode: LD_PRELOAD=libgdrcache-preload.so"
		# shellcheck disable=SC2086
		GDRCACHE_STATS=1 LD_PRELOAD=$PRE LD_LIBRARY_PATH=$FAKE:$B/lib \
			run "bench $mode, preload" "$B/bench/bench_dmabuf" $mode 2>"$OUT/err.txt"
		grep -E 'stats|warn|error' "$OUT/err.txt" | cut -c1-400
	done
	echo
	echo "===== bench_dmabuf free (preload)"
	GDRCACHE_LOG=info LD_PRELOAD=$PRE LD_LIBRARY_PATH=$FAKE:$B/lib run free "$B/bench/bench_dmabuf" free \
		2>"$OUT/err.txt"
	grep -E 'interception|warn|error' "$OUT/err.txt" | cut -c1-300
	echo
	echo "===== test_gpu"
	LD_LIBRARY_PATH=$B/lib run test_gpu "$B/tests/gpu/test_gpu" 2>&1 | tail -15
	echo "## all: $rc_all"
} 2>&1 | tee "$OUT/dmabuf.txt"
