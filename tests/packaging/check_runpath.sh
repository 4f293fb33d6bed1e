#!/bin/sh
# SPDX-License-Identifier: MIT
# No ELF file a build makes has an empty or relative element in its RUNPATH or RPATH: ld.so reads
# an empty element as the working directory, and looks there first for every library the object
# needs, wherever the program happens to run (issue 31 #7: the build tree's preload once had
# "BUILD/lib:", 33 lookups in the working directory for 15 registrations). $ORIGIN is allowed.
# Usage: check_runpath.sh BUILD. Exit 0 pass, 1 fail, 77 when readelf is missing.
set -u
build=$1
command -v readelf >/dev/null || { echo "SKIP: no readelf (binutils)"; exit 77; }
fail=0 n=0
# The objects the build makes (its CMakeFiles hold only objects and CMake's probes).
for f in $(find "$build" -path '*/CMakeFiles' -prune -o -type f \( -name '*.so*' -o -perm -u+x \) \
	-print); do
	head -c 4 "$f" 2>/dev/null | grep -q 'ELF' || continue
	n=$((n + 1))
	readelf -d "$f" 2>/dev/null | sed -n 's/.*(\(RUNPATH\|RPATH\)).*: \[\(.*\)\]$/\1 \2/p' |
		while read -r tag path; do
			rest=$path:
			while [ -n "$rest" ]; do
				el=${rest%%:*}
				rest=${rest#*:}
				case $el in
				/* | '$ORIGIN' | '$ORIGIN/'*) ;;
				'') echo "FAIL: $f: $tag [$path] has an empty element (the working directory)" ;;
				*) echo "FAIL: $f: $tag [$path] has the relative element '$el'" ;;
				esac
			done
		done
done >"${TMPDIR:-/tmp}/check_runpath.$$"
if [ -s "${TMPDIR:-/tmp}/check_runpath.$$" ]; then
	cat "${TMPDIR:-/tmp}/check_runpath.$$"
	fail=1
fi
rm -f "${TMPDIR:-/tmp}/check_runpath.$$"
[ "$n" -gt 0 ] || { echo "FAIL: no ELF file under $build"; exit 1; }
[ $fail = 0 ] && echo "ok: $n ELF files, no empty or relative RUNPATH/RPATH element"
exit $fail
