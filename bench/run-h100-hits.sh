#!/bin/bash
# SPDX-License-Identifier: MIT
# Issue 16 on the GPU machine, in one run (about 5 minutes): bench_hit -- libgdrcache (events, tag)
# beside the tagcheck baseline and UCX's ucs_rcache in one process: one-thread latency (same buffer,
# random of 128 / 1024 / 4096 buffers, mixed sizes; mean, p50, p99), throughput 1-16 threads (own,
# shared, own-rand, shared-rand), the miss and its parts, hit rates on five traces -- then the same
# benchmark against the library before issue 16 (gdr-events only), for the A/B.
# Built beforehand on the development machine (no uthash, no UCX on the GPU machine):
#   cmake -S . -B build/gpu16 -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF && cmake --build build/gpu16 -j2
#   bench/ucx-libs.sh build/gpu16/bench/bench_hit       (Debian's libucs/libucm -> build/ucx-libs)
#   optional, the library before: a tree of the earlier commit with this bench/ built into
#   build/gpu16-old (cmake -S <that tree> -B build/gpu16-old ... --target bench_hit)
# and run through the device tool with carry [build/gpu16, build/ucx-libs, build/gpu16-old]:
#   bash bench/run-h100-hits.sh
# Results in $OUT (or ./out-h100): bench_hit.txt, hits.csv, hits.png, bench_hit-old.txt.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out-h100}
ARGS=${ARGS:---seconds 0.2 --reps 3}
mkdir -p "$OUT"
UCX=$ROOT/build/ucx-libs
{
	echo "# bench/run-h100-hits.sh"
	date -u
	nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
	nvidia-smi -q -d MEMORY | grep -A3 -i bar1 | head -4
	echo "CPUs: $(nproc); $(grep -m1 'model name' /proc/cpuinfo); kernel $(uname -r)"
	lscpu | grep -i 'cache' | head -4
	ulimit -n
	bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -1)
	echo "GPU 0 at $bus; sysfs: $(ls /sys/bus/pci/devices 2>&1 | tr '\n' ' ' | cut -c1-300)"
	d=$(echo "$bus" | tr 'A-F' 'a-f' | sed 's/^0000\(....:\)/\1/')
	head -3 "/sys/bus/pci/devices/$d/resource" 2>&1
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
LD_LIBRARY_PATH=$ROOT/build/gpu16/lib:$UCX GDRCACHE_LOG=info \
	timeout 420 build/gpu16/bench/bench_hit $ARGS --csv "$OUT/hits.csv" \
	> "$OUT/bench_hit.txt" 2> "$OUT/bench_hit.err"
echo "bench_hit: exit $?"
cat "$OUT/bench_hit.txt"
grep -m3 'libgdrcache [0-9]' "$OUT/bench_hit.err"
python3 bench/plot_hits.py "$OUT/hits.csv" "$OUT/hits.png" || echo "no plot"
if [ -x build/gpu16-old/bench/bench_hit ]; then
	LD_LIBRARY_PATH=$ROOT/build/gpu16-old/lib:$UCX \
		timeout 180 build/gpu16-old/bench/bench_hit $ARGS --only gdr-events \
		> "$OUT/bench_hit-old.txt" 2> "$OUT/bench_hit-old.err"
	echo "bench_hit (library before issue 16): exit $?"
	cat "$OUT/bench_hit-old.txt"
fi
