#!/bin/sh
# SPDX-License-Identifier: MIT
# One version everywhere: VERSION (the source), the version CMake built (gdrcache/version.h,
# gdrcache.pc) and debian/changelog's newest entry (upstream part). kmod/dkms.conf and the
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
[ $fail = 0 ] && echo "ok: $v in VERSION, version.h, gdrcache.pc and debian/changelog"
exit $fail
