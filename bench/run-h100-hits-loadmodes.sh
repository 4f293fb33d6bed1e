#!/bin/bash
# SPDX-License-Identifier: MIT
# Issue 9's speed figures on the GPU machine, one run (about 4 minutes): bench_hit with libgdrcache
# linked into the executable, linked into a shared library the executable links (bench_hit_so),
# that library dlopen'ed (bench_hit_dl) and LD_PRELOADed; then bench_free (what the free
# interception adds to a cuMemFree). Needs a build carried from the development machine:
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF && cmake --build build/gpu -j2
# run through the device tool with carry [build/gpu]: bash bench/run-h100-hits-loadmodes.sh
# Output in $OUT (or ./out-h100): hits-<mode>.txt, free.txt, and hits-loadmodes.txt (everything).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out-h100}
B=${GDR_BUILD:-build/gpu}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$ROOT/$B/lib:$ROOT/$B/bench${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
ARGS=${BENCH_ARGS:---seconds 0.2 --reps 3}
{
	date -u
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	git log -1 --oneline 2>/dev/null || true
	for mode in exe so dl preload; do
		case $mode in
		exe) cmd=("$B/bench/bench_hit") ;;
		so) cmd=("$B/bench/bench_hit_so") ;;
		dl) cmd=("$B/bench/bench_hit_dl") ;;
		preload) cmd=(env LD_PRELOAD="$ROOT/$B/lib/libgdrcache.so.0" "$B/bench/bench_hit") ;;
		esac
		echo "===== bench_hit, libgdrcache $mode: ${cmd[*]} $ARGS"
		timeout 150 "${cmd[@]}" $ARGS >"$OUT/hits-$mode.txt" 2>/dev/null
		echo "exit $?"
		grep -E '^# libgdrcache loaded|systems:|gdr-events|gdr-tag|tagcheck' "$OUT/hits-$mode.txt" | head -14
	done
	echo "===== bench_free"
	timeout 120 "$B/bench/bench_free" 2 200 | tee "$OUT/free.txt"
} 2>&1 | tee "$OUT/hits-loadmodes.txt"
