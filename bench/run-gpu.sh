#!/bin/bash
# SPDX-License-Identifier: MIT
# The benchmarks on a GPU machine, one part a call: bench/run-gpu.sh PART [ARGS]. It builds what
# the part needs (cmake, Release) unless BUILD=0, runs it and writes the results under $OUT.
# bench/README.md says what each part measures. Every .txt result starts with a header: the
# machine, the GPU and driver, the date and the commit. Without a GPU every program skips (77).
#
# Parts:
#   hits          bench_hit in full: libgdrcache (events, tag), tagcheck, ucs_rcache; text, CSV,
#                 plot. OLD_BUILD: a build of an earlier tree, whose bench_hit then runs
#                 --only gdr-events for an A/B.
#   loadmodes     bench_hit with libgdrcache linked into the executable, into a shared library
#                 (bench_hit_so), that library dlopen'ed (bench_hit_dl), and LD_PRELOADed; then
#                 bench_free.
#   free          bench_free alone.
#   reg           bench_reg: a cache hit against pinning every time and the tag check alone.
#   preload       bench_preload: the preload's ibv_reg_mr/ibv_dereg_mr hit against gdr_reg/gdr_dereg,
#                 over the fake libibverbs of tests/preload.
#   preload-hits  bench_hit under the preload: gdr-events and the preload column.
#   dmabuf        the entry_bytes probe, bench_dmabuf nccl / sub 1000 / sub 10000 without and with
#                 the preload, bench_dmabuf free, test_gpu.
#   events        tests/gpu/loadmodes: every load mode x allocator (validation, frees seen, stale,
#                 memory test).
#   gpuevents     tests/gpu/events: driver API, static and shared cudart, PyTorch, in events and
#                 tag mode.
#   compare       two trees' builds in $CMP/{before,after} (lib/, bench_hit, test_gpu,
#                 gpu_memkinds each): their GPU tests, then bench_hit before, after, before, after.
#   ab SUB [N]    one library against another: the programs in $CMP, the libraries in
#                 $CMP/{before,after}/ (or $VARIANTS). SUB: tests | free | hits [R] | lat [N] |
#                 same [N] | miss [N].
#   all           hits, loadmodes, reg, preload, preload-hits, dmabuf, events.
#
# Environment:
#   OUT          where the results go (default build/bench-out)
#   GDR_BUILD    the build (default build/bench-gpu); BUILD=0 uses it as it is (a carried build)
#   GDR_COMMIT   the library's commit, for the header, where this tree's git log is not its own
#   QUICK=1      shorter runs (a harness check; the figures are too noisy to report)
#   BENCH_ARGS   bench_hit's arguments (default "--seconds 0.2 --reps 3"; QUICK: "--quick
#                --seconds 0.1 --reps 1")
#   UCX_LIBS     UCX's libraries for the ucs_rcache column (default build/ucx-libs: bench/ucx-libs.sh)
#   ITERS, THREADS, RUNS, MODES, OLD_PRELOAD   for preload: reg+dereg a thread (2000000), thread
#                counts ("1 4 16"), runs of each (1), GDRCACHE_VALIDATE modes ("events tag"), an
#                earlier libgdrcache-preload.so run the same way after this build's
#   REG_ARGS     bench_reg's threads and seconds a point ("16 0.5")
#   CMP, VARIANTS  for compare and ab: the carried builds (build/gpucmp), the libraries to
#                alternate ("before after")
#   CUDA_HOME    the CUDA toolkit for events and gpuevents (/usr/local/cuda)
#   STEPS        gpuevents' steps a program (3000; QUICK: 600)
# shellcheck disable=SC2086 # BENCH_ARGS, THREADS, MODES, VARIANTS: word lists
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
ARGV="$*"
PART=${1:-}
OUT=${OUT:-$ROOT/build/bench-out}
B=${GDR_BUILD:-$ROOT/build/bench-gpu}
case $B in /*) ;; *) B=$ROOT/$B ;; esac
CMP=${CMP:-build/gpucmp}
UCX=${UCX_LIBS:-$ROOT/build/ucx-libs}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
	BENCH_ARGS=${BENCH_ARGS:---quick --seconds 0.1 --reps 1}
	STEPS=${STEPS:-600}
else
	BENCH_ARGS=${BENCH_ARGS:---seconds 0.2 --reps 3}
	STEPS=${STEPS:-3000}
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$B/lib:$UCX${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
FAKE=$B/tests/preload/fakeverbs
PRE=$B/lib/libgdrcache-preload.so
LIBGDR=$B/lib/libgdrcache.so.0
rc_all=0

usage() {
	sed -n '3,28p' "$0" | sed 's/^# \{0,1\}//'
	exit 2
}

# header TITLE: what every result file starts with.
header() {
	local gpu
	echo "# $1"
	echo "# command: bench/run-gpu.sh $ARGV"
	echo "# date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "# machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) CPUs, kernel $(uname -r)"
	gpu=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total \
		--format=csv,noheader 2>/dev/null </dev/null)
	if [ -n "$gpu" ]; then
		echo "$gpu" | sed 's/^/# GPU, driver, memory: /'
	else
		echo "# GPU: none found (nvidia-smi absent or found no device)"
	fi
	echo "# commit: $(git log -1 --format='%h %s' 2>/dev/null || echo unknown)${GDR_COMMIT:+; library built from $GDR_COMMIT}"
}

# run NAME SECONDS COMMAND...: runs it with a time limit, says how it ended; 77 is a skip.
run() {
	local name=$1 t=$2 rc
	shift 2
	timeout -k 10 "$t" "$@" </dev/null
	rc=$?
	case $rc in
	0) echo "## $name: exit 0" ;;
	77) echo "## $name: skipped (exit 77: no GPU, or nothing to measure)" ;;
	124 | 137) echo "## $name: timed out after $t s"; rc_all=1 ;;
	*) echo "## $name: exit $rc"; rc_all=1 ;;
	esac
	return $rc
}

# note RC: the exit status of a run whose output went through a pipe (run's own note is lost there).
note() {
	[ "$1" = 0 ] || [ "$1" = 77 ] || rc_all=1
}

# build TARGET...: the Release build the part needs, unless BUILD=0.
build() {
	[ "${BUILD:-1}" = 0 ] && return 0
	mkdir -p "$OUT"
	echo "building $* in $B (log: $OUT/build.log)"
	{
		if [ ! -e "$B/CMakeCache.txt" ]; then
			cmake -S "$ROOT" -B "$B" -DCMAKE_BUILD_TYPE=Release -DGDR_BUILD_EXAMPLES=OFF \
				${UTHASH_INCLUDE_DIR:+-DUTHASH_INCLUDE_DIR=$UTHASH_INCLUDE_DIR} || return 1
		fi
		cmake --build "$B" -j"$(nproc)" --target "$@"
	} >"$OUT/build.log" 2>&1 || {
		tail -20 "$OUT/build.log"
		echo "the build failed: see $OUT/build.log (a build carried from elsewhere: BUILD=0)"
		exit 2
	}
}

# build_opt TARGET: a target that exists only where its prerequisites do (test_gpu needs cuda.h).
build_opt() {
	[ "${BUILD:-1}" = 0 ] && return 0
	cmake --build "$B" -j"$(nproc)" --target "$1" >>"$OUT/build.log" 2>&1 ||
		echo "$1 not built (see $OUT/build.log)"
}

part_hits() {
	build bench_hit
	(
		header "bench_hit in full (bench/run-gpu.sh hits)"
		timeout 30 nvidia-smi -q -d MEMORY 2>/dev/null </dev/null | grep -A3 -i bar1 | head -4
		echo "# open files: $(ulimit -n)"
		GDRCACHE_LOG=info run bench_hit 420 "$B/bench/bench_hit" $BENCH_ARGS \
			--csv "$OUT/hits.csv" 2>"$OUT/hits.err"
		grep -m3 'libgdrcache [0-9]' "$OUT/hits.err"
		if [ -s "$OUT/hits.csv" ]; then
			timeout 120 python3 bench/plot_hits.py "$OUT/hits.csv" "$OUT/hits.png" || echo "no plot"
		fi
		if [ -n "${OLD_BUILD:-}" ]; then
			echo "===== the earlier tree's library: $OLD_BUILD"
			LD_LIBRARY_PATH=$OLD_BUILD/lib:$UCX run "bench_hit (earlier tree)" 180 \
				"$OLD_BUILD/bench/bench_hit" $BENCH_ARGS --only gdr-events 2>/dev/null
		fi
		exit $rc_all
	) 2>&1 | tee "$OUT/hits.txt"
	return "${PIPESTATUS[0]}"
}

part_loadmodes() {
	build bench_hit bench_hit_so bench_hit_dl bench_free
	(
		header "bench_hit in each load mode, then bench_free (bench/run-gpu.sh loadmodes)"
		for mode in exe so dl preload; do
			case $mode in
			exe) cmd=("$B/bench/bench_hit") ;;
			so) cmd=("$B/bench/bench_hit_so") ;;
			dl) cmd=("$B/bench/bench_hit_dl") ;;
			preload) cmd=(env LD_PRELOAD="$LIBGDR" "$B/bench/bench_hit") ;;
			esac
			echo "===== bench_hit, libgdrcache $mode: ${cmd[*]} $BENCH_ARGS"
			header "bench_hit, libgdrcache $mode (bench/run-gpu.sh loadmodes)" >"$OUT/hits-$mode.txt"
			LD_LIBRARY_PATH=$B/bench:$LD_LIBRARY_PATH run "bench_hit ($mode)" 150 \
				"${cmd[@]}" $BENCH_ARGS >>"$OUT/hits-$mode.txt" 2>/dev/null
			grep -E '^# libgdrcache loaded|systems:|gdr-events|gdr-tag|tagcheck|^## |nothing to measure' \
				"$OUT/hits-$mode.txt" | head -14
		done
		echo "===== bench_free"
		run bench_free 120 "$B/bench/bench_free" 2 200
		exit $rc_all
	) 2>&1 | tee "$OUT/loadmodes.txt"
	return "${PIPESTATUS[0]}"
}

part_free() {
	build bench_free
	(
		header "bench_free (bench/run-gpu.sh free)"
		run bench_free 120 "$B/bench/bench_free" 2 200
		exit $rc_all
	) 2>&1 | tee "$OUT/free.txt"
	return "${PIPESTATUS[0]}"
}

part_reg() {
	build bench_reg
	(
		header "bench_reg (bench/run-gpu.sh reg)"
		run bench_reg 300 "$B/bench/bench_reg" ${REG_ARGS:-16 0.5}
		exit $rc_all
	) 2>&1 | tee "$OUT/reg.txt"
	return "${PIPESTATUS[0]}"
}

part_preload() {
	build bench_preload gdrcache_preload gdr_fake_ibverbs
	(
		header "bench_preload: the preload's hit against the library's (bench/run-gpu.sh preload)"
		for r in $(seq 1 "${RUNS:-1}"); do
			for so in "$PRE" ${OLD_PRELOAD:+"$OLD_PRELOAD"}; do
				for mode in ${MODES:-events tag}; do
					echo "## run $r, $so, GDRCACHE_VALIDATE=$mode (the preload's cache and the library's)"
					# shellcheck disable=SC2086 # THREADS: a list
					GDRCACHE_VALIDATE=$mode LD_PRELOAD="$so" LD_LIBRARY_PATH="$FAKE:$B/lib" \
						run bench_preload 300 "$B/bench/bench_preload" "${ITERS:-2000000}" \
						${THREADS:-1 4 16}
				done
			done
		done
		exit $rc_all
	) 2>&1 | tee "$OUT/preload.txt"
	return "${PIPESTATUS[0]}"
}

# Two systems only, so that the pins' dma-buf fds stay within the process's limit.
part_preload_hits() {
	build bench_hit gdrcache_preload gdr_fake_ibverbs
	(
		header "bench_hit under the preload: gdr-events and preload (bench/run-gpu.sh preload-hits)"
		LD_PRELOAD="$PRE" LD_LIBRARY_PATH="$FAKE:$B/lib" run bench_hit 300 \
			"$B/bench/bench_hit" --only gdr-events,preload --no-traces $BENCH_ARGS \
			--csv "$OUT/hits-preload.csv" 2>&1 | grep -v '^gdrcache\['
		note "${PIPESTATUS[0]}"
		exit $rc_all
	) 2>&1 | tee "$OUT/hits-preload.txt"
	return "${PIPESTATUS[0]}"
}

part_dmabuf() {
	build bench_dmabuf gdrcache_preload gdr_fake_ibverbs
	build_opt test_gpu
	(
		header "bench_dmabuf: NCCL's and NIXL's dma-buf registrations (bench/run-gpu.sh dmabuf)"
		gcc -O1 -o "$OUT/entry_bytes" tests/gpu/probes/entry_bytes.c -ldl &&
			run entry_bytes 60 "$OUT/entry_bytes" | head -40
		note "${PIPESTATUS[0]}"
		for mode in nccl "sub 1000" "sub 10000"; do
			echo
			echo "===== bench_dmabuf $mode: without the preload (the fake libibverbs directly)"
			# shellcheck disable=SC2086 # mode: two words
			LD_LIBRARY_PATH=$FAKE:$B/lib run "bench $mode, direct" 300 "$B/bench/bench_dmabuf" $mode
			echo "===== bench_dmabuf $mode: LD_PRELOAD=libgdrcache-preload.so"
			# shellcheck disable=SC2086
			GDRCACHE_STATS=1 LD_PRELOAD=$PRE LD_LIBRARY_PATH=$FAKE:$B/lib \
				run "bench $mode, preload" 300 "$B/bench/bench_dmabuf" $mode 2>"$OUT/err.txt"
			grep -E 'stats|warn|error' "$OUT/err.txt" | cut -c1-400
		done
		echo
		echo "===== bench_dmabuf free (preload)"
		GDRCACHE_LOG=info LD_PRELOAD=$PRE LD_LIBRARY_PATH=$FAKE:$B/lib \
			run free 300 "$B/bench/bench_dmabuf" free 2>"$OUT/err.txt"
		grep -E 'interception|warn|error' "$OUT/err.txt" | cut -c1-300
		echo
		echo "===== test_gpu"
		if [ -x "$B/tests/gpu/test_gpu" ]; then
			run test_gpu 300 "$B/tests/gpu/test_gpu" 2>&1 | tail -15
			note "${PIPESTATUS[0]}"
		else
			echo "## test_gpu: not built (cuda.h not found)"
		fi
		echo "## all: $rc_all"
		exit $rc_all
	) 2>&1 | tee "$OUT/dmabuf.txt"
	return "${PIPESTATUS[0]}"
}

part_events() {
	build gdrcache gdrcache_preload
	(
		header "libgdrcache load modes x allocators (bench/run-gpu.sh events)"
		echo "# $(timeout 30 "$CUDA_HOME/bin/nvcc" --version 2>/dev/null </dev/null |
			grep -o 'release [0-9.]*' | sed 's/^/CUDA toolkit /')"
		timeout 60 python3 -c 'import torch; print("# torch", torch.__version__)' 2>/dev/null ||
			echo "# no torch"
		echo "# libgdrcache: $LIBGDR ($(nm -D --defined-only "$LIBGDR" 2>/dev/null |
			grep -c ' gdr_intercept_get_stats') gdr_intercept_get_stats)"
		if ! timeout 30 nvidia-smi -L >/dev/null 2>&1 </dev/null; then
			echo "## events: skipped (no GPU)"
			exit 0
		fi
		QUICK=$QUICK run "load-mode matrix" 570 bash tests/gpu/loadmodes/run.sh "$B" "$B/loadmodes-out"
		cp "$B/loadmodes-out/all-logs.txt" "$OUT/events-logs.txt" 2>/dev/null
		exit $rc_all
	) 2>&1 | tee "$OUT/events.txt"
	return "${PIPESTATUS[0]}"
}

part_gpuevents() {
	build gdrcache
	local ev=$B/gpuevents inc="-I$ROOT/include -I$B/include" lnk="-L$B/lib -lgdrcache"
	mkdir -p "$ev"
	(
		header "tests/gpu/events: every allocator, events and tag mode (bench/run-gpu.sh gpuevents)"
		if ! timeout 30 nvidia-smi -L >/dev/null 2>&1 </dev/null; then
			echo "## gpuevents: skipped (no GPU)"
			exit 0
		fi
		# shellcheck disable=SC2086 # inc, lnk: lists
		gcc -O2 -Wall -Wextra -Werror -Wno-unused-parameter -DEVT_CHECK_CUDA_H $inc \
			-I"$CUDA_HOME/include" tests/gpu/events/test_events_driver.c \
			-o "$ev/test_events_driver" $lnk -ldl && echo "built test_events_driver"
		# shellcheck disable=SC2086
		"$CUDA_HOME/bin/nvcc" -O2 $inc tests/gpu/events/test_events_runtime.cu \
			-o "$ev/test_events_runtime" $lnk -lcuda && echo "built test_events_runtime (static cudart)"
		# shellcheck disable=SC2086
		"$CUDA_HOME/bin/nvcc" -O2 -cudart shared $inc tests/gpu/events/test_events_runtime.cu \
			-o "$ev/test_events_runtime_shared" $lnk -lcuda &&
			echo "built test_events_runtime_shared (shared cudart)"
		for mode in events tag; do
			export GDR_TEST_VALIDATE=$mode
			echo "===== driver API, validate $mode"
			run "driver/$mode" 90 "$ev/test_events_driver" "$STEPS"
			echo "===== CUDA runtime, static cudart, validate $mode"
			run "runtime-static/$mode" 90 "$ev/test_events_runtime" "$STEPS"
			echo "===== CUDA runtime, shared cudart, validate $mode"
			run "runtime-shared/$mode" 90 "$ev/test_events_runtime_shared" "$STEPS"
			for conf in "" expandable_segments:True backend:cudaMallocAsync; do
				echo "===== PyTorch [${conf:-default}], LD_PRELOAD, validate $mode"
				PYTORCH_CUDA_ALLOC_CONF=$conf LD_PRELOAD=$LIBGDR GDRCACHE_LIB=$LIBGDR \
					run "torch[${conf:-default}]/$mode" 120 python3 tests/gpu/events/test_events_torch.py
			done
		done
		exit $rc_all
	) 2>&1 | tee "$OUT/gpuevents.txt"
	return "${PIPESTATUS[0]}"
}

part_compare() {
	(
		header "two trees side by side: $CMP/before, $CMP/after (bench/run-gpu.sh compare)"
		for v in before after; do
			echo "## $v: test_gpu"
			LD_LIBRARY_PATH=$CMP/$v/lib:$LD_LIBRARY_PATH run "test_gpu ($v)" 300 \
				"$CMP/$v/test_gpu" 2>&1 | tail -25
			note "${PIPESTATUS[0]}"
			echo "## $v: gpu_memkinds"
			LD_LIBRARY_PATH=$CMP/$v/lib:$LD_LIBRARY_PATH run "gpu_memkinds ($v)" 300 \
				"$CMP/$v/gpu_memkinds" 2>&1 | grep -v '^gdrcache\[' | tail -25
			note "${PIPESTATUS[0]}"
		done
		for r in 1 2; do
			for v in before after; do
				echo "## bench_hit run $r: $v"
				LD_LIBRARY_PATH=$CMP/$v/lib:$LD_LIBRARY_PATH run "bench_hit ($v, run $r)" 400 \
					"$CMP/$v/bench_hit" $BENCH_ARGS --csv "$OUT/hits-$v-$r.csv" 2>/dev/null
			done
		done
		exit $rc_all
	) 2>&1 | tee "$OUT/compare.txt"
	return "${PIPESTATUS[0]}"
}

# with VARIANT COMMAND...: the command against $CMP/VARIANT's libgdrcache.
with() {
	local v=$1
	shift
	LD_LIBRARY_PATH=$CMP/$v:$LD_LIBRARY_PATH "$@"
}

# rounds N VARIANTS FN: N rounds, in each FN V for every variant V, its line after "V round ".
rounds() {
	local n=$1 vs=$2 fn=$3 r v
	for r in $(seq 1 "$n"); do
		for v in $vs; do
			printf '%-6s %s ' "$v" "$r"
			"$fn" "$v"
		done
	done
}

lat1() {
	with "$1" timeout 120 "$CMP/bench_hit" --latency-only --only gdr-events --seconds 0.2 \
		</dev/null 2>&1 | grep -E '^  (gdr-events |floor)|nothing to measure' | grep -v libgdr |
		tr '\n' ' '
	echo
}

same1() {
	with "$1" timeout 120 "$CMP/bench_hit" --latency-only --only gdr-events --reps 3 \
		--seconds 0.1 --quick </dev/null 2>&1 | grep -E '^  gdr-events  |nothing to measure' |
		grep -v libgdr
}

miss1() {
	with "$1" timeout 120 "$CMP/bench_hit" --miss-only </dev/null 2>&1 |
		grep -E 'paired|nothing to measure' | sed 's/.*differences //; s/ us)//' | tr '\n' ' '
	echo
}

part_ab() {
	local sub=${1:-} n=${2:-}
	(
		header "one library against another: $CMP/{${VARIANTS:-before after}} (bench/run-gpu.sh ab $sub${n:+ $n})"
		case $sub in
		tests)
			with after run test_gpu 300 "$CMP/test_gpu" 2>&1 | tail -30
			note "${PIPESTATUS[0]}"
			with after run gpu_memkinds 300 "$CMP/gpu_memkinds" 2>&1 | grep -v '^gdrcache\[' | tail -25
			note "${PIPESTATUS[0]}"
			;;
		free)
			for v in before after; do
				echo "## bench_free: $v"
				with "$v" run "bench_free ($v)" 200 "$CMP/bench_free" 2 200
			done
			;;
		hits)
			for v in before after; do
				echo "## bench_hit run ${n:-1}: $v"
				with "$v" run "bench_hit ($v, run ${n:-1})" 250 "$CMP/bench_hit" $BENCH_ARGS \
					--csv "$OUT/hits-$v-${n:-1}.csv" 2>/dev/null
			done
			;;
		lat) rounds "${n:-5}" "before after" lat1 ;;
		same) rounds "${n:-10}" "${VARIANTS:-before after}" same1 ;;
		miss) rounds "${n:-10}" "${VARIANTS:-before after}" miss1 ;;
		*) echo "usage: bench/run-gpu.sh ab tests | free | hits [R] | lat [N] | same [N] | miss [N]"; exit 2 ;;
		esac
		exit $rc_all
	) 2>&1 | tee "$OUT/ab-${sub:-none}${n:+-$n}.txt"
	return "${PIPESTATUS[0]}"
}

mkdir -p "$OUT"
if { [ "$PART" = compare ] || [ "$PART" = ab ]; } && [ ! -d "$CMP/before" ]; then
	echo "bench/run-gpu.sh $PART: no $CMP/before: carry the two builds there (CMP)"
	exit 2
fi
case $PART in
hits) part_hits ;;
loadmodes) part_loadmodes ;;
free) part_free ;;
reg) part_reg ;;
preload) part_preload ;;
preload-hits) part_preload_hits ;;
dmabuf) part_dmabuf ;;
events) part_events ;;
gpuevents) part_gpuevents ;;
compare) part_compare ;;
ab) shift; part_ab "$@" ;;
all)
	rc=0
	for p in hits loadmodes reg preload preload_hits dmabuf events; do
		"part_$p" || rc=1
	done
	exit $rc
	;;
*) usage ;;
esac
