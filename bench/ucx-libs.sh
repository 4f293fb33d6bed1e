#!/bin/bash
# SPDX-License-Identifier: MIT
# Copies the UCX shared libraries bench_hit needs (Debian's libucs, libucm and what they load that
# the GPU machine may lack) into build/ucx-libs, to be carried to the GPU machine.
set -eu
BIN=${1:-build/gpu/bench/bench_hit}
DST=build/ucx-libs
mkdir -p "$DST"
for lib in $(ldd "$BIN" | awk '/libuc[sm]|libnuma/ {print $3}'); do
	cp -L "$lib" "$DST/"
done
ls -l "$DST"
du -sh "$DST"
