#!/bin/bash
# SPDX-License-Identifier: MIT
# The load-mode matrix (issue 9) on a GPU machine: builds the programs of this directory against a
# built libgdrcache, runs every load mode x allocator, and prints one table.
#   load modes: 1 linked into the executable, 2 linked into libmw.so that the executable links (or
#   that Python loads with ctypes), 3 dlopen'ed after CUDA init, 4 dlopen'ed before, 5 LD_PRELOAD,
#   6 Python ctypes (after / before CUDA init: the Python form of 3 and 4)
#   allocators: driver API (cuMemAlloc), static cudart, shared cudart (cudaMalloc), PyTorch with
#   its default allocator, expandable segments, and the cudaMallocAsync backend
# Each row: one process; 8 threads, LM_REGS (1,000,000) registrations of random ranges of 64
# buffers, each checked against the driver's BUFFER_ID (a mismatch is a stale registration), 1 op
# in LM_FREE_EVERY a free + reallocation of the same size (the VA comes back); then the memory test
# (lm.h). Usage: run.sh GDR_BUILD_DIR [OUT_DIR]; QUICK=1: 100,000 registrations a row. OUT_DIR
# gets table.txt, logs/ (one a row) and all-logs.txt (all of them, the library's lines counted).
# Exit 0 when every row that ran passed (stale 0, memory test passed), else 1.
set -u
here=$(cd "$(dirname "$0")" && pwd)
gdr_build=$(cd "$1" && pwd)
out=${2:-$PWD/out-loadmodes}
bin=$gdr_build/loadmodes
lib=$gdr_build/lib/libgdrcache.so.0
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$out/logs" "$bin"
[ -e "$lib" ] || { echo "no $lib: build libgdrcache first"; exit 2; }

export LM_REGS=${LM_REGS:-$([ "${QUICK:-0}" = 1 ] && echo 100000 || echo 1000000)}
export LM_THREADS=${LM_THREADS:-8} LM_MAX_SECONDS=${LM_MAX_SECONDS:-60}
export GDRCACHE_BACKEND=${GDRCACHE_BACKEND:-dmabuf} # no NIC, no gdrcache.ko on the GPU machine
export LM_GDR_LIB=$lib LM_BIN=$bin PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
free_every_c=${LM_FREE_EVERY:-100}
free_every_torch=${LM_TORCH_FREE_EVERY:-100}
# torch rows: mostly tensors of 10 MiB and more, each its own segment, so that a free (del +
# empty_cache) reaches the driver and the next tensor of the size gets the VA back
sizes_torch=${LM_TORCH_SIZES:-4096,1048576,12582912,16777216,20975616,33554432}
timeout_c=${LM_ROW_TIMEOUT_C:-120} timeout_torch=${LM_ROW_TIMEOUT_TORCH:-180}

echo "building the programs into $bin"
make -k -s -C "$here" GDR_BUILD="$gdr_build" CUDA_HOME="$CUDA_HOME" O="$bin" \
	>"$out/logs/build.log" 2>&1 || echo "(some programs did not build: $out/logs/build.log)"

torch_why=
if ! command -v python3 >/dev/null; then
	torch_why="no python3"
elif ! torch_why=$(python3 -c 'import torch, sys
sys.exit(0 if torch.cuda.is_available() else "torch sees no GPU")' 2>&1 >/dev/null); then
	torch_why=${torch_why##*$'\n'}
	[ -n "$torch_why" ] || torch_why="torch not usable"
else
	torch_why=
fi

mode_name() {
	case $1 in
	linked) echo "1 linked into the exe" ;;
	mw) echo "2 middleware libmw.so" ;;
	dlopen-after) echo "3 dlopen after CUDA init" ;;
	dlopen-before) echo "4 dlopen before CUDA init" ;;
	preload) echo "5 LD_PRELOAD" ;;
	py-mw) echo "2 ctypes loads libmw.so" ;;
	ctypes-after) echo "6 ctypes after CUDA init" ;;
	ctypes-before) echo "6 ctypes before CUDA init" ;;
	esac
}
alloc_name() {
	case $1 in
	drv) echo "driver API" ;; rts) echo "static cudart" ;; rtd) echo "shared cudart" ;;
	default) echo "torch default" ;; expandable) echo "torch expandable" ;;
	async) echo "torch cudaMallocAsync" ;;
	esac
}

fmt='%-26s %-21s %-7s %9s %9s %9s %9s %6s %8s %7s %-5s %7s %7s %5s\n'
table=$out/table.txt
{
	printf "$fmt" "load mode" allocator valid regs "frees" "frees" "ring" stale "reg" "same" \
		"mem" "mem" "mem" ""
	printf "$fmt" "" "" "" "" "made" "seen" "events" "" "fail/ref" "VA" "test" "MiB" "realloc" "s"
} >"$table"
fail=0 rows=0 passed=0 skipped=0

kv() { # key, LMROW line
	local w
	for w in $2; do [ "${w%%=*}" = "$1" ] && { echo "${w#*=}"; return; }; done
	echo "?"
}

row() { # mode-key, alloc-key, timeout, command...
	local m=$1 a=$2 t=$3 log rc line
	shift 3
	log=$out/logs/$m-$a.log
	rows=$((rows + 1))
	printf '%s / %s: ' "$(mode_name "$m")" "$(alloc_name "$a")"
	timeout "$t" "$@" >"$log" 2>&1
	rc=$?
	line=$(grep '^LMROW ' "$log" | tail -1)
	if [ -n "$line" ]; then
		local regs=$(kv regs "$line") stale=$(kv stale "$line") mem=$(kv mem "$line")
		printf "$fmt" "$(mode_name "$m")" "$(alloc_name "$a")" "$(kv validate "$line")" \
			"$regs" "$(kv frees_made "$line")" "$(kv frees_seen "$line")" \
			"$(kv ring "$line")" "$stale" "$(kv fails "$line")/$(kv refused "$line")" \
			"$(kv same_va "$line")" "$mem" "$(kv mem_diff_mib "$line")" \
			"$(kv mem_realloc "$line")" "$(kv secs "$line")" >>"$table"
		[ "$(kv capped "$line")" = 1 ] && echo "   (stopped at LM_MAX_SECONDS)" >>"$table"
		if [ "$rc" = 0 ]; then passed=$((passed + 1)); else fail=1; fi
		echo "rc $rc, validate $(kv validate "$line"), regs $regs, stale $stale, memory test $mem"
	elif [ "$rc" = 77 ]; then
		skipped=$((skipped + 1))
		printf '%-26s %-21s skipped (%s)\n' "$(mode_name "$m")" "$(alloc_name "$a")" \
			"$(grep -m1 '^SKIP' "$log" | sed 's/^SKIP: //')" >>"$table"
		echo "skipped"
	else
		fail=1
		printf '%-26s %-21s FAILED: exit %s%s (%s)\n' "$(mode_name "$m")" \
			"$(alloc_name "$a")" "$rc" "$([ "$rc" = 124 ] && echo ', timeout')" \
			"logs/$m-$a.log" >>"$table"
		echo "FAILED rc $rc"; tail -5 "$log" | sed 's/^/   /'
	fi
}

c_row() { # mode, alloc
	local m=$1 a=$2 how=dyn
	case $m in linked) how=linked ;; mw) how=mw ;; esac
	local exe=$bin/lm_${how}_$a
	if [ ! -x "$exe" ]; then
		rows=$((rows + 1)) skipped=$((skipped + 1))
		local why="did not build: logs/build.log"
		[ "$a" = rts ] && [ ! -e "$CUDA_HOME/lib64/libcudart_static.a" ] && why="no static cudart"
		printf '%-26s %-21s skipped (%s)\n' "$(mode_name "$m")" "$(alloc_name "$a")" "$why" \
			>>"$table"
		return
	fi
	if [ "$m" = preload ]; then
		row "$m" "$a" "$timeout_c" env LM_FREE_EVERY="$free_every_c" LD_PRELOAD="$lib" "$exe" "$m" "$a"
	else
		row "$m" "$a" "$timeout_c" env LM_FREE_EVERY="$free_every_c" "$exe" "$m" "$a"
	fi
}

torch_row() { # mode, allocator configuration
	local m=$1 c=$2 conf= pm=$1
	case $c in expandable) conf=expandable_segments:True ;; async) conf=backend:cudaMallocAsync ;; esac
	[ "$m" = py-mw ] && pm=mw
	if [ -n "$torch_why" ] || [ ! -e "$bin/liblmdyn.so" ]; then
		rows=$((rows + 1)) skipped=$((skipped + 1))
		printf '%-26s %-21s skipped (%s)\n' "$(mode_name "$m")" "$(alloc_name "$c")" \
			"${torch_why:-liblmdyn.so did not build}" >>"$table"
		return
	fi
	local pre=()
	[ "$m" = preload ] && pre=(LD_PRELOAD="$lib")
	row "$m" "$c" "$timeout_torch" env "${pre[@]}" PYTORCH_CUDA_ALLOC_CONF="$conf" \
		LM_FREE_EVERY="$free_every_torch" LM_SIZES="$sizes_torch" python3 "$here/lm_torch.py" "$pm" "$c"
}

t0=$SECONDS
for m in linked mw dlopen-after dlopen-before preload ctypes-after ctypes-before; do
	case $m in
	ctypes-*) ;;
	*) for a in drv rts rtd; do c_row "$m" "$a"; done ;;
	esac
	case $m in
	linked) printf '%-26s %-21s n/a (a Python interpreter is not linked with libgdrcache)\n' \
		"$(mode_name linked)" "torch (all three)" >>"$table" ;;
	mw) for c in default expandable async; do torch_row py-mw "$c"; done ;;
	preload | ctypes-*) for c in default expandable async; do torch_row "$m" "$c"; done ;;
	esac
done

{
	echo
	echo "rows $rows: passed $passed, skipped $skipped, failed $((rows - passed - skipped));" \
		"$LM_REGS registrations a row, $LM_THREADS threads; $((SECONDS - t0)) s"
	echo "valid: validation in effect (gdr_cache_get_stats.validate_mode, GDRCACHE_VALIDATE=auto)."
	echo "frees made: by the program (C rows) or torch's num_device_free (torch rows), during the"
	echo "churn; frees seen: gdr_intercept_get_stats, all routes, same window (n/a: not in this"
	echo "library); ring events: events the library published (gdr_private_events_head) in the"
	echo "window (n/a: not in this library). stale: registrations whose buffer id was not the"
	echo "driver's BUFFER_ID of the address (must be 0). reg fail/ref: gdr_reg errors / -EOPNOTSUPP"
	echo "refusals. mem test: ~95 % of free memory in 1 GiB chunks allocated, registered and"
	echo "released (pins kept: max_bytes 1T), freed; MiB = cuMemGetInfo before the allocation minus"
	echo "after the frees (must be within 64); realloc = chunks allocated again / chunks."
} >>"$table"
# Every row's log in one file; the library's own log lines counted by pattern (addresses and
# sizes masked), since refused pool registrations log two lines each.
for f in "$out"/logs/*.log; do
	echo "===== $(basename "$f")"
	grep -v '^gdrcache\[' "$f"
	grep '^gdrcache\[' "$f" | sed -E 's/^gdrcache\[[0-9]+\]/gdrcache/; s/0x[0-9a-f]+/ADDR/g;
		s/[+][0-9]+/+N/g; s/, [0-9]+\)/, N)/g' | sort | uniq -c | sort -rn | head -20
done >"$out/all-logs.txt"
echo
cat "$table"
exit $fail
