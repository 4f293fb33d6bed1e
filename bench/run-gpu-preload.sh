#!/bin/bash
# SPDX-License-Identifier: MIT
# bench_preload on a GPU machine (issue 16 item 4): the preload's ibv_reg_mr/ibv_dereg_mr hit
# against the library's gdr_reg/gdr_dereg hit, over the fake libibverbs (no NIC there) and the
# real CUDA driver. Needs a build with tests (for tests/preload's fake libibverbs), carried:
#   cmake -S . -B build/gpupre -DCMAKE_BUILD_TYPE=Release -DGDR_BUILD_EXAMPLES=OFF &&
#   cmake --build build/gpupre --target bench_preload gdrcache_preload gdr_fake_ibverbs
# Output: $OUT/preload.txt.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GDR_BUILD:-$ROOT/build/gpupre}
OUT=${OUT:-$ROOT/out-gpu}
mkdir -p "$OUT"
{
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
	for mode in events tag; do
		echo "## GDRCACHE_VALIDATE=$mode (the preload's cache and the library's)"
		GDRCACHE_VALIDATE=$mode LD_PRELOAD="$B/lib/libgdrcache-preload.so" \
			LD_LIBRARY_PATH="$B/tests/preload/fakeverbs:$B/lib" \
			"$B/bench/bench_preload" "${ITERS:-2000000}"
	done
} 2>&1 | tee "$OUT/preload.txt"
