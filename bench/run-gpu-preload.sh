#!/bin/bash
# SPDX-License-Identifier: MIT
# bench_preload on a GPU machine (issue 16 item 4): the preload's ibv_reg_mr/ibv_dereg_mr hit
# against the library's gdr_reg/gdr_dereg hit, over the fake libibverbs (no NIC there) and the
# real CUDA driver. Needs a build with tests (for tests/preload's fake libibverbs), carried:
#   cmake -S . -B build/gpupre -DCMAKE_BUILD_TYPE=Release -DGDR_BUILD_EXAMPLES=OFF &&
#   cmake --build build/gpupre --target bench_preload bench_hit gdrcache_preload gdr_fake_ibverbs
# Environment:
#   GDR_BUILD    the build (default build/gpupre)
#   ITERS        reg+dereg a thread (default 2000000)
#   THREADS      thread counts (default "1 4 16")
#   RUNS         runs of each (default 1): single-thread figures vary between runs on a VM
#   MODES        GDRCACHE_VALIDATE modes (default "events tag")
#   OLD_PRELOAD  another libgdrcache-preload.so (an earlier tree's, built the same way), run the
#                same way after this build's, for a before/after in one sitting
# Output: $OUT/preload.txt.
# With the argument "hits": bench_hit under the preload instead, gdr-events and its preload column
# (issue 16: "bench_hit gains the preload column"), without the traces (the preload's cache is
# gdr-events'); two systems only, so that the pins' dma-buf fds stay within the process's limit.
# Needs bench_hit in the build too (--target bench_hit). Output: $OUT/hits-preload.{txt,csv}.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GDR_BUILD:-$ROOT/build/gpupre}
OUT=${OUT:-$ROOT/out-gpu}
mkdir -p "$OUT"
if [ "${1:-}" = hits ]; then
	LD_PRELOAD="$B/lib/libgdrcache-preload.so" \
		LD_LIBRARY_PATH="$B/tests/preload/fakeverbs:$B/lib" \
		"$B/bench/bench_hit" --only gdr-events,preload --no-traces --seconds 0.2 --reps 3 \
		--csv "$OUT/hits-preload.csv" 2>&1 | grep -v '^gdrcache\[' | tee "$OUT/hits-preload.txt"
	exit "${PIPESTATUS[0]}"
fi
{
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
	for run in $(seq 1 "${RUNS:-1}"); do
		for so in "$B/lib/libgdrcache-preload.so" ${OLD_PRELOAD:+"$OLD_PRELOAD"}; do
			for mode in ${MODES:-events tag}; do
				echo "## run $run, $so, GDRCACHE_VALIDATE=$mode (the preload's cache and the library's)"
				# shellcheck disable=SC2086 # THREADS: a list
				GDRCACHE_VALIDATE=$mode LD_PRELOAD="$so" \
					LD_LIBRARY_PATH="$B/tests/preload/fakeverbs:$B/lib" \
					"$B/bench/bench_preload" "${ITERS:-2000000}" ${THREADS:-1 4 16}
			done
		done
	done
} 2>&1 | tee "$OUT/preload.txt"
