#!/bin/bash
# SPDX-License-Identifier: MIT
# Issue 9's acceptance on the GPU machine, in one run (about 4-6 minutes; QUICK=1: about 2-3):
# every load mode of libgdrcache x {driver API, static cudart, shared cudart, PyTorch default,
# expandable segments, cudaMallocAsync}: validation mode in effect, frees seen / frees made, stale
# registrations over 1,000,000 registrations with concurrent frees and reallocations at the same
# VA, and the memory test (tests/gpu/loadmodes/run.sh says what each row does).
# libgdrcache: $GDR_BUILD if given; else build/gpu when it holds a build (carried from the
# development machine, as for bench/run-h100.sh:
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF && cmake --build build/gpu -j2
# and run through the device tool with carry [build/gpu]); else built here with cmake into
# build/h100-events (needs uthash.h, which the project's GPU machine lacks: carry a build there).
# The programs are built here (gcc, the CUDA toolkit).
# Output in $OUT (or ./out-h100): h100-events.txt (the machine, a line a row as it runs, the table),
# h100-events-logs.txt (every row's log); the logs one by one in $GDR_BUILD/h100-events/logs.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out-h100}
mkdir -p "$OUT"
if [ -n "${GDR_BUILD:-}" ]; then
	:
elif [ -e build/gpu/lib/libgdrcache.so.0 ]; then
	GDR_BUILD=build/gpu
else
	GDR_BUILD=build/h100-events
	echo "building libgdrcache with cmake into $GDR_BUILD"
	{ cmake -S . -B "$GDR_BUILD" -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF \
		-DGDR_BUILD_BENCH=OFF -DGDR_BUILD_EXAMPLES=OFF &&
		cmake --build "$GDR_BUILD" -j"$(nproc)"; } >"$OUT/h100-events-build.log" 2>&1 ||
		{ tail -20 "$OUT/h100-events-build.log"; echo "libgdrcache did not build"; exit 2; }
fi
{
	echo "# libgdrcache load modes x allocators (bench/run-h100-events.sh)"
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	echo "CPUs: $(nproc); kernel $(uname -r); $("${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" --version |
		grep -o 'release [0-9.]*' | sed 's/^/CUDA toolkit /')"
	python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "no torch"
	git log -1 --oneline 2>/dev/null || true
	echo "libgdrcache: $GDR_BUILD/lib/libgdrcache.so.0" \
		"($(nm -D --defined-only "$GDR_BUILD/lib/libgdrcache.so.0" 2>/dev/null |
			grep -c ' gdr_intercept_get_stats') gdr_intercept_get_stats)"
	echo
	bash tests/gpu/loadmodes/run.sh "$GDR_BUILD" "$GDR_BUILD/h100-events"
	rc=$?
	cp "$GDR_BUILD/h100-events/all-logs.txt" "$OUT/h100-events-logs.txt"
	echo "exit $rc"
	exit $rc
} 2>&1 | tee "$OUT/h100-events.txt"
exit "${PIPESTATUS[0]}"
