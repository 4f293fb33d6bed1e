#!/bin/sh
# SPDX-License-Identifier: MIT
# The library exports exactly the symbols its version script lists: the API (gdr_-prefixed, none of
# gdrcopy's libgdrapi: a program must be able to link both), and the free-event interception
# (lib/hooks.c): dlsym and dlvsym under glibc's nodes, gdr_private_* and the CUDA driver's free
# entry points in GDRCACHE_PRIVATE, nothing else. It has no link-time libcuda.
set -eu
lib=$1 map=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRWi]$/ {print $3}' | sort -u >"$tmp/versioned"
sed 's/@.*//' "$tmp/versioned" | sort -u >"$tmp/exported"
sed -n 's/^[[:space:]]*\([A-Za-z_][A-Za-z0-9_]*\);/\1/p' "$map" | sort -u >"$tmp/listed"
fail=0
if ! diff -u "$tmp/listed" "$tmp/exported"; then
	echo "FAIL: exported symbols differ from $map"; fail=1
fi
for s in gdr_open gdr_close gdr_pin_buffer gdr_pin_buffer_v2 gdr_unpin_buffer gdr_get_callback_flag \
	gdr_get_info gdr_get_info_v2 gdr_map gdr_map_v2 gdr_unmap gdr_copy_to_mapping \
	gdr_copy_from_mapping gdr_get_attribute gdr_runtime_get_version gdr_driver_get_version; do
	if grep -qx "$s" "$tmp/exported"; then echo "FAIL: exports libgdrapi's $s"; fail=1; fi
done
# Names without the gdr_ prefix: only the interception's, each in its node.
allowed='^(dlsym@GLIBC_2\.2\.5|dlsym@@GLIBC_2\.34|dlvsym@GLIBC_2\.2\.5|dlvsym@@GLIBC_2\.34|cu(MemFree|MemFree_v2|MemFreeAsync|MemFreeAsync_ptsz|MemFreeHost|MemUnmap|IpcCloseMemHandle|CtxDestroy|CtxDestroy_v2|DevicePrimaryCtxReset|DevicePrimaryCtxReset_v2|DevicePrimaryCtxRelease|DevicePrimaryCtxRelease_v2|GetProcAddress|GetProcAddress_v2)@@GDRCACHE_PRIVATE)$'
if grep -v '^gdr_' "$tmp/versioned" | grep -v -E "$allowed"; then
	echo "FAIL: symbols without the gdr_ prefix beyond the free interception's"; fail=1
fi
for s in dlsym@GLIBC_2.2.5 dlsym@@GLIBC_2.34; do
	grep -qx "$s" "$tmp/versioned" || { echo "FAIL: $s not exported"; fail=1; }
done
if grep '^gdr_private_' "$tmp/versioned" | grep -v '@@GDRCACHE_PRIVATE$'; then
	echo "FAIL: gdr_private_* outside GDRCACHE_PRIVATE"; fail=1
fi
if grep '^gdr_' "$tmp/versioned" | grep -v '^gdr_private_' | grep -v '@@GDRCACHE_0\.'; then
	echo "FAIL: API symbols outside a GDRCACHE_x.y node"; fail=1
fi
if readelf -d "$lib" | grep -q 'NEEDED.*libcuda'; then echo "FAIL: links libcuda"; fail=1; fi
if ! readelf -d "$lib" | grep -q 'SONAME.*libgdrcache\.so\.[0-9]'; then echo "FAIL: soname"; fail=1; fi
[ $fail = 0 ] && echo "ok: $(wc -l <"$tmp/exported") symbols exported, all listed, none of libgdrapi's"
exit $fail
