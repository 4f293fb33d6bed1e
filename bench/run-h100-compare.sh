#!/bin/bash
# SPDX-License-Identifier: MIT
# Two trees on the GPU machine, side by side (issue 13: a redesign that must change no behaviour
# and no figure). build/gpucmp/{before,after} each hold Release builds, made on the development
# machine from the two commits, of lib/libgdrcache.so*, bench_hit, test_gpu and gpu_memkinds
# (after: also include/ and the preload, for tests/gpu/loadmodes):
#   git archive REV | tar -x -C /tmp/T && cmake -S /tmp/T -B /tmp/T/b -DCMAKE_BUILD_TYPE=Release
#   cmake --build /tmp/T/b --target bench_hit test_gpu gpu_memkinds gdrcache gdrcache_preload
# carried with the device tool ([build/gpucmp, build/ucx-libs]). Runs each tree's GPU tests, then
# bench_hit alternately (before, after, before, after: the spread between runs of one tree is the
# noise); with the argument "events", the load-mode matrix (QUICK) on the after tree instead (each
# part fits one 10-minute device call). Output in $OUT (or ./out-cmp).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out-cmp}
C=build/gpucmp
mkdir -p "$OUT"
if [ "${1:-}" = events ]; then
	QUICK=1 GDR_BUILD=$C/after OUT="$OUT" timeout 550 bash bench/run-h100-events.sh > "$OUT/events.log" 2>&1
	echo "load-mode matrix exit $?"
	tail -45 "$OUT/events.log"
	exit 0
fi
export LD_LIBRARY_PATH=$ROOT/build/ucx-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
{
	echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(nproc) CPUs"
	date -u
	for v in before after; do
		echo "## $v: test_gpu"
		LD_LIBRARY_PATH=$C/$v/lib:$LD_LIBRARY_PATH timeout 300 $C/$v/test_gpu 2>&1 | tail -25
		echo "test_gpu ($v) exit ${PIPESTATUS[0]}"
		echo "## $v: gpu_memkinds"
		LD_LIBRARY_PATH=$C/$v/lib:$LD_LIBRARY_PATH timeout 300 $C/$v/gpu_memkinds 2>&1 |
			grep -v '^gdrcache\[' | tail -25
		echo "gpu_memkinds ($v) exit ${PIPESTATUS[0]}"
	done
	for r in 1 2; do
		for v in before after; do
			echo "## bench_hit run $r: $v"
			LD_LIBRARY_PATH=$C/$v/lib:$LD_LIBRARY_PATH timeout 400 $C/$v/bench_hit \
				--seconds 0.2 --reps 3 --csv "$OUT/hits-$v-$r.csv" 2>/dev/null
			echo "bench_hit ($v, run $r) exit $?"
		done
	done
} 2>&1 | tee "$OUT/compare.txt"
