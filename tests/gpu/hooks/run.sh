#!/bin/bash
# SPDX-License-Identifier: MIT
# The free-event proof on a GPU machine: builds rt_events.cu with nvcc (shared and static cudart,
# linked with libgdrcache and not), runs each linked / LD_PRELOADed, then torch_events.py preloaded.
# Usage: tests/gpu/hooks/run.sh DIR-HOLDING-libgdrcache.so.0 [OUT-DIR]. Exit 0 if all saw every
# free, 77 if there is no GPU.
set -u
here=$(cd "$(dirname "$0")" && pwd)
libdir=$(cd "$1" && pwd); out=${2:-/tmp}
command -v nvcc >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "no GPU/nvcc: skip"; exit 77; }
tmp=$(mktemp -d)
ln -sf "$libdir/libgdrcache.so.0" "$tmp/libgdrcache.so"
cd "$tmp"
fail=0
b() { nvcc -O2 -o "$@" "$here/rt_events.cu" || fail=1; }
b rt_shared_linked -cudart shared -L. -lgdrcache -Xlinker -rpath="$libdir"
b rt_static_linked -cudart static -L. -lgdrcache -Xlinker -rpath="$libdir"
b rt_shared -cudart shared
b rt_static -cudart static
ptsz() { nvcc -O2 --default-stream per-thread -o "$@" "$here/rt_events.cu" || fail=1; }
ptsz rt_ptds_linked -cudart shared -L. -lgdrcache -Xlinker -rpath="$libdir"
run() { echo "== $*"; "$@" || fail=1; }
run ./rt_shared_linked shared-cudart-linked
run ./rt_static_linked static-cudart-linked
run ./rt_ptds_linked ptds-shared-cudart-linked
run env LD_PRELOAD="$libdir/libgdrcache.so.0" ./rt_shared shared-cudart-preloaded
run env LD_PRELOAD="$libdir/libgdrcache.so.0" ./rt_static static-cudart-preloaded
echo "== not linked, not preloaded (expected: no libgdrcache)"; ./rt_shared plain
run env PYTHONUNBUFFERED=1 GDR_LIB="$libdir/libgdrcache.so.0" LD_PRELOAD="$libdir/libgdrcache.so.0" python3 "$here/torch_events.py"
echo "hooks proof: $([ $fail = 0 ] && echo ok || echo FAIL)"
exit $fail
