#!/bin/bash
# SPDX-License-Identifier: MIT
# Everything issue 5 measures and proves on the GPU machine, in one run (about 4-5 minutes):
#   bench_hit (libgdrcache events + tag, the tagcheck baseline, UCX ucs_rcache) -> text, CSV, PNG
#   tests/gpu/events: driver API, CUDA runtime (static and shared cudart, built here with nvcc)
#   and PyTorch (default allocator, expandable segments, cudaMallocAsync backend), each in events
#   mode and in tag mode.
# Built beforehand on the development machine (UCX is not on the GPU machine):
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF && cmake --build build/gpu -j2
#   bench/ucx-libs.sh        (copies Debian's libucs/libucm and what they need to build/ucx-libs)
# and run through the device tool with carry [build/gpu, build/ucx-libs]:
#   bash bench/run-h100.sh
# Results go to $OUT (or ./out-h100): run-h100.log (everything), bench_hit.txt, hits.csv,
# hit_throughput.png, gpu_events.txt. QUICK=1 shortens every part (harness check only);
# SKIP_BENCH=1 runs the correctness programs alone.
set -u
ROOT=$PWD
OUT=${OUT:-$ROOT/out-h100}
mkdir -p "$OUT" "$ROOT/build/ev"
export LD_LIBRARY_PATH=$ROOT/build/gpu/lib:$ROOT/build/ucx-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
	BENCH_ARGS="--quick --seconds 0.1 --reps 1"
	STEPS=600
else
	BENCH_ARGS="--seconds 0.3 --reps 5"
	STEPS=3000
fi
LIBGDR=$ROOT/build/gpu/lib/libgdrcache.so.0
rc_all=0

section() { printf '\n===== %s =====\n' "$*"; }

run() { # name, timeout, command...: prints the exit status; 77 is a skip
	local name=$1 t=$2 rc
	shift 2
	timeout "$t" "$@"
	rc=$?
	echo "## $name: exit $rc$([ $rc = 77 ] && echo ' (skip)')"
	[ $rc = 0 ] || [ $rc = 77 ] || rc_all=1
}

{
	section machine
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	echo "CPUs: $(nproc); kernel $(uname -r)"
	git log -1 --oneline 2>/dev/null || true
	ls -l "$LIBGDR" build/gpu/bench/bench_hit
	ldd build/gpu/bench/bench_hit | grep -E 'gdrcache|ucs|ucm|numa|not found'

	section "bench_hit $BENCH_ARGS"
	[ "${SKIP_BENCH:-0}" = 1 ] || run bench_hit 240 build/gpu/bench/bench_hit $BENCH_ARGS --csv "$OUT/hits.csv" \
		> "$OUT/bench_hit.txt" 2> build/ev/bench_hit.err
	cat "$OUT/bench_hit.txt"
	echo "bench_hit's stderr (lines, counted):"
	sort build/ev/bench_hit.err | uniq -c | sort -rn | head -20
	[ "${SKIP_BENCH:-0}" = 1 ] || python3 bench/plot_hits.py "$OUT/hits.csv" "$OUT/hit_throughput.png"
} 2>&1 | tee "$OUT/run-h100.log"

{
	section "build tests/gpu/events"
	INC="-I$ROOT/include -I$ROOT/build/gpu/include"
	LNK="-L$ROOT/build/gpu/lib -lgdrcache"  # found through LD_LIBRARY_PATH above
	gcc -O2 -Wall -Wextra -Werror -Wno-unused-parameter -DEVT_CHECK_CUDA_H $INC \
		-I"$CUDA_HOME/include" tests/gpu/events/test_events_driver.c \
		-o build/ev/test_events_driver $LNK -ldl && echo "built test_events_driver"
	nvcc -O2 $INC tests/gpu/events/test_events_runtime.cu -o build/ev/test_events_runtime \
		$LNK -lcuda && echo "built test_events_runtime (static cudart)"
	nvcc -O2 -cudart shared $INC tests/gpu/events/test_events_runtime.cu \
		-o build/ev/test_events_runtime_shared $LNK -lcuda &&
		echo "built test_events_runtime_shared (shared cudart)"

	for mode in events tag; do
		export GDR_TEST_VALIDATE=$mode
		section "driver API, validate $mode"
		run "driver/$mode" 90 build/ev/test_events_driver $STEPS
		section "CUDA runtime, static cudart, validate $mode"
		run "runtime-static/$mode" 90 build/ev/test_events_runtime $STEPS
		section "CUDA runtime, shared cudart, validate $mode"
		run "runtime-shared/$mode" 90 build/ev/test_events_runtime_shared $STEPS
		for conf in "" expandable_segments:True backend:cudaMallocAsync; do
			section "PyTorch [${conf:-default}], LD_PRELOAD, validate $mode"
			PYTORCH_CUDA_ALLOC_CONF=$conf LD_PRELOAD=$LIBGDR GDRCACHE_LIB=$LIBGDR \
				run "torch[${conf:-default}]/$mode" 120 python3 tests/gpu/events/test_events_torch.py
		done
	done
	unset GDR_TEST_VALIDATE
	section summary
} 2>&1 | tee "$OUT/gpu_events.txt" | tee -a "$OUT/run-h100.log" >/dev/null
grep -E '^## |^(PASS|FAIL|SKIP)|wrong [0-9]' "$OUT/gpu_events.txt" | tee -a "$OUT/run-h100.log"
grep -E 'ratios' -A 12 "$OUT/bench_hit.txt" 2>/dev/null
exit $rc_all
