#!/bin/bash
# SPDX-License-Identifier: MIT
# Issue 11 on a GPU machine (two GPUs for the multi-GPU part: the device tool's nvidia-h200-x2):
# the driver probe (tests/gpu/probes/mem_probe.c: what pool, multi-GPU and imported memory report
# and export) and the library's checks (tests/gpu/test_memkinds.c). About 20 s.
# libgdrcache from $GDR_BUILD (default build/gpu, carried from the development machine:
#   cmake -S . -B build/gpu -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF && cmake --build build/gpu
# ). Output in $OUT (or ./out-gpu): memkinds.txt.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out-gpu}
B=${GDR_BUILD:-build/gpu}
CUDA=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$OUT"
gcc -O2 -Wall -I"$CUDA/include" tests/gpu/probes/mem_probe.c -o "$OUT/mem_probe" \
	-L"$CUDA/lib64/stubs" -lcuda -lpthread || exit 2
gcc -O2 -Wall -Iinclude -I"$B/include" -I"$CUDA/include" tests/gpu/test_memkinds.c \
	-o "$OUT/test_memkinds" -L"$B/lib" -lgdrcache -L"$CUDA/lib64/stubs" -lcuda -lpthread \
	-Wl,-rpath,"$ROOT/$B/lib" || exit 2
{
	echo "# issue 11 on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sort | uniq -c | tr '\n' ' ')"
	date -u
	git log -1 --oneline 2>/dev/null || true
	echo "## the driver (probe)"
	timeout 200 "$OUT/mem_probe"
	echo "## the library (test_memkinds)"
	timeout 300 "$OUT/test_memkinds"
	echo "test_memkinds exit $?"
} 2>&1 | tee "$OUT/memkinds.txt" | grep -v '^gdrcache\['
