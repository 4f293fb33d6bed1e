#!/bin/sh
# SPDX-License-Identifier: MIT
# One version everywhere: VERSION (the source), the version CMake built (gdrcache/version.h,
# gdrcache.pc), debian/changelog's newest entry (upstream part), the newest stanza of the map and
# debian/libgdrcache0.symbols' GDRCACHE_PRIVATE range. kmod/dkms.conf and the module's
# MODULE_VERSION: tests/nvidia/check-version.sh.
# Usage: check_version.sh BUILD SOURCE. Exit 0 pass, 1 fail.
set -u
build=$1 src=$2
fail=0
v=$(cat "$src/VERSION")
echo "$v" | grep -Eqx '[0-9]+\.[0-9]+\.[0-9]+' || { echo "FAIL: VERSION is '$v'"; exit 1; }
h=$(awk '/define GDR_VERSION_(MAJOR|MINOR|PATCH) / { printf "%s%s", sep, $3; sep = "." }' \
	"$build/include/gdrcache/version.h")
[ "$h" = "$v" ] || { echo "FAIL: version.h says $h, VERSION $v"; fail=1; }
pc=$(sed -n 's/^Version: *//p' "$build/gdrcache.pc")
[ "$pc" = "$v" ] || { echo "FAIL: gdrcache.pc says $pc, VERSION $v"; fail=1; }
# debian/changelog: "gdrcache (0.1.0-1) unstable; urgency=medium", upstream part before the last -.
d=$(sed -n '1s/^[^ ]* (\([^)]*\)).*/\1/p' "$src/debian/changelog")
[ "${d%-*}" = "$v" ] || { echo "FAIL: debian/changelog says ${d%-*} ($d), VERSION $v"; fail=1; }
# The newest symbol version of lib/libgdrcache.map is the release's major.minor: an API added
# without a version bump (or a bump without its stanza) fails here.
m=$(sed -n 's/^GDRCACHE_\([0-9]*\.[0-9]*\) {.*/\1/p' "$src/lib/libgdrcache.map" | sort -t. -k1,1n -k2,2n | tail -1)
[ "$m" = "${v%.*}" ] || { echo "FAIL: the newest stanza of libgdrcache.map is GDRCACHE_$m, VERSION $v"; fail=1; }
# debian/libgdrcache0.symbols: GDRCACHE_PRIVATE binds a dependent package to this upstream release
# only (the file says why), and its symbols carry that release.
next=${v%.*}.$((${v##*.} + 1))
sym=$src/debian/libgdrcache0.symbols
t=$(sed -n 's/^| *//p' "$sym" 2>/dev/null)
[ "$t" = "libgdrcache0 (>= $v), libgdrcache0 (<< $next~)" ] ||
	{ echo "FAIL: $sym's GDRCACHE_PRIVATE template is '$t', VERSION $v"; fail=1; }
if grep '@GDRCACHE_PRIVATE ' "$sym" 2>/dev/null | grep -qv "@GDRCACHE_PRIVATE $v 1\$"; then
	echo "FAIL: $sym lists a GDRCACHE_PRIVATE symbol without '$v 1' (this release, the template)"
	fail=1
fi
[ $fail = 0 ] && echo "ok: $v in VERSION, version.h, gdrcache.pc, debian/changelog, the map's GDRCACHE_$m" \
	"and libgdrcache0.symbols' GDRCACHE_PRIVATE"
exit $fail
