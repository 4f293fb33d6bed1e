#!/bin/bash
# SPDX-License-Identifier: MIT
#
# Real UCX UCM (CUDA bistro hooks) and libgdrcache patching the same libcuda entries in one
# process, in both orders. Run on the GPU machine (no network needed) from the repository root:
#
#   OUT=/some/dir bash tests/gpu/ucx/run.sh
#
# Needs build/ucx/ucx-src.tar.gz (UCX source with ./configure already generated: no autotools
# needed here), gcc, make, tar, /usr/local/cuda (or CUDA_HOME), libcuda, a GPU. Builds libgdrcache
# into build/gpupre (cmake) when build/gpupre/lib/libgdrcache.so is missing or lacks the monitor API.
# Writes $OUT/ucx-two-patchers.txt (everything, with a table at the end) plus per-run logs.
# Exit: 0 nothing crashed or hung; 1 a run crashed or hung; 2 setup/build failed (reason printed);
# 3 CUDA not usable in the test process (no result).
set -u -o pipefail

ROOT=$(pwd)
OUT=${OUT:-$ROOT/build/ucx/out}
mkdir -p "$OUT"
LOG=$OUT/ucx-two-patchers.txt
: >"$LOG"
exec 3>&1 4>&2
exec > >(tee -a "$LOG") 2>&1
TEE_PID=$!
# let tee write the last lines before the script's exit ends the run
finish() { rc=$?; set +x; exec 1>&3 2>&4; wait "$TEE_PID" 2>/dev/null; exit $rc; }
trap finish EXIT
PS4='+ [$(date +%T)] '

CUDA=${CUDA_HOME:-/usr/local/cuda}
TARBALL=${UCX_TARBALL:-$ROOT/build/ucx/ucx-src.tar.gz}
SRC=/tmp/ucx-src
INST=/tmp/ucx-inst
GDRB=${GDR_BUILD_DIR:-$ROOT/build/gpupre}
N=${N:-1000}
JOBS=${JOBS:-16}
T_START=$(date +%s)

step_t0=0
step() { step_t0=$(date +%s); echo; echo "==== $* ($(date +%T), t+$((step_t0 - T_START))s)"; }
step_done() { echo "---- $1 took $(($(date +%s) - step_t0)) s"; }
die() {
	set +x
	echo
	echo "FAILED: $*"
	echo "(total $(($(date +%s) - T_START)) s; logs in $OUT)"
	exit 2
}

set -x
# ---------------------------------------------------------------- header
step "machine"
set +x
echo "date:      $(date -u +%FT%TZ)"
echo "host:      $(hostname)"
echo "kernel:    $(uname -r)"
if command -v nvidia-smi >/dev/null; then
	nvidia-smi -L
	echo "driver:    $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)"
else
	echo "nvidia-smi: not found"
fi
[ -r /proc/driver/nvidia/version ] && head -1 /proc/driver/nvidia/version
echo "gcc:       $(gcc --version 2>/dev/null | head -1)"
echo "nvcc:      $("$CUDA/bin/nvcc" --version 2>/dev/null | grep release || echo absent)"
echo "cuda.h:    $(grep -m1 '#define CUDA_VERSION' "$CUDA/include/cuda.h" 2>/dev/null || echo absent)"
echo "libgdrcache tree: $(cat "$ROOT/VERSION" 2>/dev/null)"
echo "UCX tarball: $TARBALL ($(stat -c %s "$TARBALL" 2>/dev/null || echo missing) bytes)"
echo "UCX commit:  $(tar -xzOf "$TARBALL" ./UCX_COMMIT 2>/dev/null | tr '\n' ' ')"
set -x

step "tool checks"
missing=
for t in gcc make tar timeout awk sed grep; do
	command -v $t >/dev/null || missing="$missing $t"
done
[ -z "$missing" ] || die "missing tools:$missing"
[ -f "$TARBALL" ] || die "no UCX source tarball at $TARBALL (carry build/ucx/ucx-src.tar.gz)"
[ -f "$CUDA/include/cuda.h" ] || die "no $CUDA/include/cuda.h (set CUDA_HOME)"
[ -f "$CUDA/include/cuda_runtime.h" ] || die "no $CUDA/include/cuda_runtime.h"
ls "$CUDA"/lib64/libcudart.so* >/dev/null 2>&1 || die "no $CUDA/lib64/libcudart.so*"
ls "$CUDA"/lib64/stubs/libcuda.so "$CUDA"/lib64/libcuda.so /usr/lib/x86_64-linux-gnu/libcuda.so \
	>/dev/null 2>&1 || echo "warning: no libcuda.so to link against found in the usual places"
command -v cmake >/dev/null || echo "note: no cmake (only a problem if libgdrcache must be built)"
step_done "tool checks"

# ---------------------------------------------------------------- libgdrcache
step "libgdrcache"
need_gdr=0
if [ ! -f "$GDRB/lib/libgdrcache.so" ]; then
	need_gdr=1
elif command -v nm >/dev/null && ! nm -D "$GDRB/lib/libgdrcache.so" | grep -q ' T gdr_mem_monitor_create$'; then
	echo "build/gpupre/lib/libgdrcache.so lacks gdr_mem_monitor_create: stale, rebuilding"
	need_gdr=1
fi
if [ $need_gdr = 1 ]; then
	command -v cmake >/dev/null || die "libgdrcache must be built but cmake is missing"
	cmake -S "$ROOT" -B "$GDRB" -DCMAKE_BUILD_TYPE=Release -DGDR_BUILD_EXAMPLES=OFF \
		>"$OUT/gdrcache-build.log" 2>&1 &&
		cmake --build "$GDRB" -j"$JOBS" --target gdrcache >>"$OUT/gdrcache-build.log" 2>&1 ||
		{ tail -30 "$OUT/gdrcache-build.log"; die "libgdrcache build failed (gdrcache-build.log)"; }
fi
ls -la "$GDRB/lib/libgdrcache.so"*
sha256sum "$GDRB/lib/libgdrcache.so.0."* 2>/dev/null | head -1
[ -f "$GDRB/include/gdrcache/version.h" ] || die "no $GDRB/include/gdrcache/version.h (cmake configure of build/gpupre incomplete)"
step_done "libgdrcache"

# ---------------------------------------------------------------- UCX configure
step "UCX unpack + configure"
rm -rf "$SRC" "$INST"
mkdir -p "$SRC"
tar -xzf "$TARBALL" -C "$SRC" || die "cannot untar $TARBALL"
[ -x "$SRC/configure" ] || die "$TARBALL has no ./configure (autogen.sh was not run before packing)"
cd "$SRC"
# configure --with-cuda=DIR insists on nvml.h and -lnvidia-ml (for UCT's cuda transports, which
# are not built here; UCM's cuda module does not use NVML). Where they are missing, a shim
# satisfies the check only.
extra_cppflags= extra_ldflags=
if [ ! -f "$CUDA/include/nvml.h" ] ||
	! echo 'int nvmlInit(void); int main(void){return nvmlInit();}' |
	gcc -x c - -o /tmp/nvmltest -L"$CUDA/lib64" -L"$CUDA/lib64/stubs" -lnvidia-ml >/dev/null 2>&1; then
	echo "NOTE: nvml.h or libnvidia-ml.so missing: using a configure-only NVML shim"
	mkdir -p /tmp/nvmlshim/include /tmp/nvmlshim/lib
	[ -f "$CUDA/include/nvml.h" ] || printf '%s\n' '#pragma once' 'typedef int nvmlReturn_t;' \
		'nvmlReturn_t nvmlInit(void);' >/tmp/nvmlshim/include/nvml.h
	echo 'int nvmlInit(void){return 0;} int nvmlInit_v2(void){return 0;}' |
		gcc -x c - -shared -fPIC -o /tmp/nvmlshim/lib/libnvidia-ml.so
	extra_cppflags=-I/tmp/nvmlshim/include extra_ldflags=-L/tmp/nvmlshim/lib
fi
gencode=
"$CUDA/bin/nvcc" --version >/dev/null 2>&1 && gencode=--with-nvcc-gencode=-gencode=arch=compute_90,code=sm_90
./configure --prefix="$INST" --with-cuda="$CUDA" $gencode \
	--disable-dependency-tracking --disable-static --disable-doxygen-doc \
	--disable-examples --disable-test-apps \
	--without-rocm --without-ze --without-verbs --without-rdmacm --without-knem \
	--without-xpmem --without-ugni --without-fuse3 --without-go --without-java \
	--without-mad --without-gdrcopy --without-valgrind --without-mpi --without-efa \
	--without-gaudi --without-bfd \
	${extra_cppflags:+CPPFLAGS=$extra_cppflags} ${extra_ldflags:+LDFLAGS=$extra_ldflags} \
	>"$OUT/ucx-configure.log" 2>&1
crc=$?
cp -f config.log "$OUT/ucx-config.log" 2>/dev/null
if [ $crc != 0 ]; then
	tail -25 "$OUT/ucx-configure.log"
	grep -n "error:" "$OUT/ucx-configure.log" | head -5
	die "UCX configure failed (rc $crc): see ucx-configure.log and ucx-config.log"
fi
sed -n '/UCX build configuration/,/====/p' "$OUT/ucx-configure.log" | tail -n +1
grep -E "checking for (cuda.h|cuda_runtime.h|nvml.h|cuDeviceGetUuid in -lcuda|cudaGetDeviceCount in -lcudart|nvmlInit in -lnvidia-ml)" "$OUT/ucx-configure.log"
grep -q 'define ucm_MODULES ".*cuda' config.h || {
	grep -n "ucm_MODULES\|HAVE_CUDA" config.h
	die "UCX configure did not enable UCM's cuda module (ucm_MODULES lacks cuda): see ucx-config.log (cuda.h / -lcuda / -lcudart / nvml checks above)"
}
step_done "UCX configure"

# ---------------------------------------------------------------- UCX build (ucm + its cuda module, ucs)
step "UCX build: src/ucm (with src/ucm/cuda) and src/ucs"
# -Wno-error: UCX builds with -Werror; a newer gcc's new warning must not stop this run.
{ make -j"$JOBS" CFLAGS=-Wno-error -C src/ucm &&
	make -j"$JOBS" CFLAGS=-Wno-error -C src/ucs &&
	make -C src/ucm install && make -C src/ucs install; } >"$OUT/ucx-make.log" 2>&1
mrc=$?
if [ $mrc != 0 ]; then
	grep -n -m5 -E "error:|Error [0-9]" "$OUT/ucx-make.log"
	tail -30 "$OUT/ucx-make.log"
	die "UCX make failed (rc $mrc): see ucx-make.log"
fi
ls -la "$INST/lib" "$INST/lib/ucx"
[ -f "$INST/lib/ucx/libucm_cuda.so" ] || die "UCX built but $INST/lib/ucx/libucm_cuda.so is missing"
command -v ldd >/dev/null && ldd "$INST/lib/ucx/libucm_cuda.so"
step_done "UCX build"

# ---------------------------------------------------------------- the test program
step "build two_patchers_ucx"
cd "$ROOT"
PROG=/tmp/two_patchers_ucx
gcc -O2 -g -Wall -o "$PROG" tests/gpu/ucx/two_patchers_ucx.c \
	-I"$INST/include" -I"$ROOT/include" -I"$GDRB/include" \
	-L"$INST/lib" -L"$GDRB/lib" \
	-Wl,--no-as-needed -lucs -lucm -Wl,--as-needed -lgdrcache -ldl \
	-Wl,-rpath,"$INST/lib" -Wl,-rpath,"$GDRB/lib" >"$OUT/prog-build.log" 2>&1 ||
	{ cat "$OUT/prog-build.log"; die "test program failed to build"; }
cp -f "$PROG" "$OUT/" 2>/dev/null
step_done "build two_patchers_ucx"

# ---------------------------------------------------------------- runs
# tag | mode | extra environment
RUNS=(
	"A|ucm-first|"
	"B|gdr-first|"
	"C|ucm-first|GDRCACHE_INTERCEPT=yield"
	"A-far|ucm-first|UCX_MEM_BISTRO_FORCE_FAR_JUMP=y"
	"B-far|gdr-first|UCX_MEM_BISTRO_FORCE_FAR_JUMP=y"
	"C-gdrfirst|gdr-first|GDRCACHE_INTERCEPT=yield"
	"base-ucm|ucm-only|"
	"base-gdr|gdr-only|"
)
declare -A RC STATUS
crashed=0 nocuda=0
for r in "${RUNS[@]}"; do
	IFS='|' read -r tag mode extra <<<"$r"
	step "run $tag: $mode ${extra:-}"
	env -u GDRCACHE_INTERCEPT -u UCX_MEM_BISTRO_FORCE_FAR_JUMP \
		UCX_MEM_CUDA_HOOK_MODE=bistro UCX_LOG_LEVEL=diag UCX_MEM_LOG_LEVEL=debug \
		UCX_HANDLE_ERRORS=bt GDRCACHE_LOG=info ORDER_TAG="$tag" \
		LD_LIBRARY_PATH="$INST/lib:$CUDA/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
		CUDART_LIB="$(ls "$CUDA"/lib64/libcudart.so.[0-9]* 2>/dev/null | head -1)" \
		$extra timeout -k 5 60 "$PROG" "$mode" "$N" >"$OUT/run-$tag.txt" 2>&1
	rc=$?
	RC[$tag]=$rc
	if [ $rc = 0 ]; then
		STATUS[$tag]=ok
	elif [ $rc = 124 ] || [ $rc = 137 ]; then
		STATUS[$tag]="HUNG(timeout)"
		crashed=1
	elif [ $rc -gt 128 ]; then
		STATUS[$tag]="CRASH(SIG$(kill -l $((rc - 128)) 2>/dev/null))"
		crashed=1
	elif [ $rc = 2 ]; then
		STATUS[$tag]="no-CUDA"
		nocuda=1
	else
		STATUS[$tag]="exit$rc"
	fi
	grep -q "Caught signal" "$OUT/run-$tag.txt" && STATUS[$tag]="${STATUS[$tag]}+UCX-caught-signal" && crashed=1
	cat "$OUT/run-$tag.txt"
	echo "---- run $tag: rc=$rc ${STATUS[$tag]}"
	step_done "run $tag"
done
set +x

# ---------------------------------------------------------------- summary
echo
echo "==================================================================== what each side said"
for r in "${RUNS[@]}"; do
	IFS='|' read -r tag mode extra <<<"$r"
	f=$OUT/run-$tag.txt
	echo "--- $tag ($mode ${extra:-}): rc=${RC[$tag]} ${STATUS[$tag]}"
	grep -E "^STEP|^ENTRY (after-ucm|after-gdr|end) +cuMemFree_v2|failed to install|cuda memory hooks|installed bistro hook for 'cuMemFree|gdrcache\[.*(warn|error|info)|Caught signal|FATAL|RESULT .*skipped|^END" "$f" |
		sed -E 's/^\[[0-9.]+\] \[[^]]*\] +//' | cut -c1-300 | head -40
done

echo
echo "==================================================================== table (N=$N per API)"
printf '%-11s %-10s %-24s %-8s %-7s %-9s %-9s %-9s %-9s %-9s %-8s %-8s\n' \
	run mode status api frees_ok ucm_free ucm_match gdr_free gdr_match gdr_stats leak_MiB us/pair
for r in "${RUNS[@]}"; do
	IFS='|' read -r tag mode extra <<<"$r"
	f=$OUT/run-$tag.txt
	if ! grep -q "^RESULT .*frees_ok=" "$f"; then
		printf '%-11s %-10s %-24s %s\n' "$tag" "$mode" "${STATUS[$tag]}" "(no RESULT line)"
		continue
	fi
	grep "^RESULT .*frees_ok=" "$f" | awk -v tag="$tag" -v mode="$mode" -v st="${STATUS[$tag]}" '{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "%-11s %-10s %-24s %-8s %-7s %-9s %-9s %-9s %-9s %-9s %-8s %-8s\n", tag, mode, st,
		       v["api"], v["frees_ok"], v["ucm_free"], v["ucm_free_match"], v["gdr_free"],
		       v["gdr_free_match"], v["gdr_stats_frees"], v["leak_mib"], v["us_per_pair"] }'
done
echo
echo "setup (who patched, what each said):"
printf '%-11s %-42s %-60s %s\n' run "UCM ucm_set_event_handler / cuda module" "gdr_mem_events_state" "UCX 'failed to install' lines"
for r in "${RUNS[@]}"; do
	IFS='|' read -r tag mode extra <<<"$r"
	f=$OUT/run-$tag.txt
	u=$(grep -m1 "ucm_set_event_handler" "$f" | sed -E 's/.*= (-?[0-9]+ \([^)]*\)).*libucm_cuda.so loaded: ([A-Za-z]+).*/\1 module:\2/')
	g=$(grep -m1 "gdr_mem_events_state =" "$f" | sed -E 's/.*gdr_mem_events_state = //; s/ in [0-9.]+ s$//' | cut -c1-60)
	n=$(grep -c "failed to install" "$f")
	h=$(grep -m1 -o "cuda memory hooks mode bistro: installed [0-9]* on driver API" "$f" | sed 's/cuda memory hooks mode //')
	printf '%-11s %-42s %-60s %s %s\n' "$tag" "${u:--}" "${g:--}" "$n" "${h:+($h)}"
done
echo
echo "columns: ucm_free/gdr_free = free events each side's callback got during the loop;"
echo "  *_match = of those, events for the address being freed; gdr_stats = delta of"
echo "  gdr_intercept_get_stats frees[GDR_FREE_MEM_FREE]; leak_MiB = drop of cuMemGetInfo free"
echo "  memory over the loop (1 MiB per pair: a chain that skipped the real free would show ~N)."
echo "total $(($(date +%s) - T_START)) s; logs: $OUT"
if [ $crashed = 1 ]; then
	echo "RESULT: a run crashed or hung"
	exit 1
fi
if [ $nocuda = 1 ]; then
	echo "RESULT: CUDA was not usable in a test process (no result for it)"
	exit 3
fi
echo "RESULT: no crash, no hang"
exit 0
