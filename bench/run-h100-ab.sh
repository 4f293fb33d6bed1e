#!/bin/bash
# SPDX-License-Identifier: MIT
# One tree's library against another's on the GPU machine, the same programs for both (they include
# only the public header): build/gpucmp/{before,after}/ hold the two libgdrcache.so builds (Release,
# made on the development machine), build/gpucmp/ the programs built from the after tree
# (bench_hit with the ucs_rcache column, bench_free, test_gpu, gpu_memkinds), build/ucx-libs the
# UCX libraries bench_hit needs (bench/ucx-libs.sh); carried with the device tool
# ([build/gpucmp, build/ucx-libs]). Each part fits one 10-minute device call:
#   tests   test_gpu and gpu_memkinds against the after library
#   free    bench_free, before then after
#   hits R  bench_hit in full, before then after (run R of them: the spread between runs of one
#           library is the noise)
#   lat N   bench_hit --latency-only, N rounds alternating before/after (the random-hit rows, and
#           the floor row: the least a lock-free hit does, measured in the same process)
#   same N  the same, quick (3 runs a point, shorter), for many rounds: a finer alternation
#           ($VARIANTS: other libraries in build/gpucmp/ to alternate, "before after" by default)
#   miss N  bench_hit --miss-only, N rounds alternating ($VARIANTS): each round's median of the
#           paired differences with tagcheck, gdr-events / gdr-tag / ucs-rcache, in us
# Output in $OUT (or ./out-ab).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
OUT=${OUT:-$ROOT/out-ab}
C=build/gpucmp
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$ROOT/build/ucx-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
with() { local v=$1; shift; LD_LIBRARY_PATH=$C/$v:$LD_LIBRARY_PATH "$@"; }
# rounds N VARIANTS FN: N rounds, in each FN V for every variant V, its line after "V round ".
rounds() {
	local n=$1 vs=$2 fn=$3
	for r in $(seq 1 "$n"); do
		for v in $vs; do
			printf '%-6s %s ' "$v" "$r"
			"$fn" "$v"
		done
	done
}
lat1() { with "$1" $C/bench_hit --latency-only --only gdr-events --seconds 0.2 2>&1 |
	grep -E '^  (gdr-events |floor)' | grep -v libgdr | tr '\n' ' '; echo; }
same1() { with "$1" $C/bench_hit --latency-only --only gdr-events --reps 3 --seconds 0.1 \
	--quick 2>&1 | grep '^  gdr-events  ' | grep -v libgdr; }
miss1() {
	with "$1" $C/bench_hit --miss-only 2>&1 | grep 'paired' |
		sed 's/.*differences //; s/ us)//' | tr '\n' ' '
	echo
}
{
	echo "# $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); $(nproc) CPUs; part ${1:-}"
	date -u
	case ${1:-} in
	tests)
		with after timeout 300 $C/test_gpu 2>&1 | tail -30
		echo "test_gpu exit ${PIPESTATUS[0]}"
		with after timeout 300 $C/gpu_memkinds 2>&1 | grep -v '^gdrcache\[' | tail -25
		echo "gpu_memkinds exit ${PIPESTATUS[0]}"
		;;
	free)
		for v in before after; do
			echo "## bench_free: $v"
			with $v timeout 200 $C/bench_free 2 200
			echo "bench_free ($v) exit $?"
		done
		;;
	hits)
		for v in before after; do
			echo "## bench_hit run ${2:-1}: $v"
			with $v timeout 250 $C/bench_hit --seconds 0.2 --reps 3 \
				--csv "$OUT/hits-$v-${2:-1}.csv" 2>/dev/null
			echo "bench_hit ($v, run ${2:-1}) exit $?"
		done
		;;
	lat) rounds "${2:-5}" "before after" lat1 ;;
	same) rounds "${2:-10}" "${VARIANTS:-before after}" same1 ;;
	miss) rounds "${2:-10}" "${VARIANTS:-before after}" miss1 ;;
	*) echo "usage: bench/run-h100-ab.sh tests | free | hits R | lat N | same N | miss N"; exit 2 ;;
	esac
} 2>&1 | tee "$OUT/ab-${1:-none}${2:+-$2}.txt"
