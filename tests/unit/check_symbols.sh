#!/bin/sh
# SPDX-License-Identifier: MIT
# The library exports exactly the symbols its version script lists: the API (gdr_-prefixed, none of
# gdrcopy's libgdrapi: a program must be able to link both), and gdr_private_* entry points for tests
# in GDRCACHE_PRIVATE, nothing else: no dlsym, no CUDA driver name (the free interception patches
# libcuda's own entries, lib/intercept/hooks.c). It has no link-time libcuda, and it is never unloaded.
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
# Nothing without the gdr_ prefix.
if grep -v '^gdr_' "$tmp/versioned"; then
	echo "FAIL: symbols without the gdr_ prefix"; fail=1
fi
if grep '^gdr_private_' "$tmp/versioned" | grep -v '@@GDRCACHE_PRIVATE$'; then
	echo "FAIL: gdr_private_* outside GDRCACHE_PRIVATE"; fail=1
fi
if grep '^gdr_' "$tmp/versioned" | grep -v '^gdr_private_' | grep -v '@GDRCACHE_0\.'; then
	echo "FAIL: API symbols outside a GDRCACHE_x.y node"; fail=1
fi
# Symbol versions: a function is the default (NAME@@NODE, what programs link now) in the newest
# GDRCACHE_0.* stanza that lists it; an older stanza that lists it too keeps that node's version for
# the programs built against it (NAME@NODE, lib/cache/compat-0_1.c). Exactly those, no others.
awk '/^GDRCACHE_0\.[0-9]+ *\{/ { node = $1 } /^}/ { node = "" }
     node && /^[[:space:]]*gdr_[A-Za-z0-9_]*;/ { gsub(/[[:space:];]/, ""); print $0, node }' "$map" |
	awk '{ n[$1]++; v[$1, n[$1]] = $2 }
	     END { for (s in n) for (i = 1; i <= n[s]; i++) print s (i == n[s] ? "@@" : "@") v[s, i] }' |
	sort >"$tmp/expected"
grep '^gdr_' "$tmp/versioned" | grep -v '^gdr_private_' | sort >"$tmp/api"
if ! diff -u "$tmp/expected" "$tmp/api"; then
	echo "FAIL: symbol versions differ from $map's stanzas"; fail=1
fi
if readelf -d "$lib" | grep -q 'NEEDED.*libcuda'; then echo "FAIL: links libcuda"; fail=1; fi
if ! readelf -d "$lib" | grep -q 'SONAME.*libgdrcache\.so\.[0-9]'; then echo "FAIL: soname"; fail=1; fi
# libcuda's patched entries jump into the library: dlclose must not unload it.
if ! readelf -d "$lib" | grep -q 'FLAGS_1.*NODELETE'; then echo "FAIL: not marked nodelete"; fail=1; fi
[ $fail = 0 ] && echo "ok: $(wc -l <"$tmp/exported") symbols exported, all listed, none of libgdrapi's"
exit $fail
