#!/bin/sh
# SPDX-License-Identifier: MIT
# One version everywhere: VERSION (the source), the version CMake built (gdrcache/version.h,
# gdrcache.pc), debian/changelog's newest entry (upstream part) and the newest stanza of the map. kmod/dkms.conf and the
# module's MODULE_VERSION: tests/nvidia/check-version.sh.
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
[ $fail = 0 ] && echo "ok: $v in VERSION, version.h, gdrcache.pc, debian/changelog and the map's GDRCACHE_$m"
exit $fail
