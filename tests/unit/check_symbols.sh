#!/bin/sh
# SPDX-License-Identifier: MIT
# The library exports exactly the symbols its version script lists, all gdr_-prefixed, none of
# gdrcopy's libgdrapi (a program must be able to link both), and has no link-time libcuda.
set -eu
lib=$1 map=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRW]$/ {sub(/@.*/, "", $3); print $3}' | sort >"$tmp/exported"
sed -n 's/^[[:space:]]*\(gdr_[a-z_]*\);/\1/p' "$map" | sort >"$tmp/listed"
fail=0
if ! diff -u "$tmp/listed" "$tmp/exported"; then
	echo "FAIL: exported symbols differ from $map"; fail=1
fi
for s in gdr_open gdr_close gdr_pin_buffer gdr_pin_buffer_v2 gdr_unpin_buffer gdr_get_callback_flag \
	gdr_get_info gdr_get_info_v2 gdr_map gdr_map_v2 gdr_unmap gdr_copy_to_mapping \
	gdr_copy_from_mapping gdr_get_attribute gdr_runtime_get_version gdr_driver_get_version; do
	if grep -qx "$s" "$tmp/exported"; then echo "FAIL: exports libgdrapi's $s"; fail=1; fi
done
if grep -v '^gdr_' "$tmp/exported"; then echo "FAIL: symbols without the gdr_ prefix"; fail=1; fi
if readelf -d "$lib" | grep -q 'NEEDED.*libcuda'; then echo "FAIL: links libcuda"; fail=1; fi
if ! readelf -d "$lib" | grep -q 'SONAME.*libgdrcache\.so\.[0-9]'; then echo "FAIL: soname"; fail=1; fi
[ $fail = 0 ] && echo "ok: $(wc -l <"$tmp/exported") symbols exported, all listed, none of libgdrapi's"
exit $fail
