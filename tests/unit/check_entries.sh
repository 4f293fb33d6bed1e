#!/bin/sh
# SPDX-License-Identifier: MIT
# lib/intercept/entries.h is the one list of the CUDA driver entry points the library intercepts.
# The library's hooks, the fake driver's assembly entries and call counters, test_patch's list and
# the GPU probe are generated from it by the preprocessor; this checks what is not: that each fake
# libcuda (tests/fake, and its bad-entry build) exports exactly the rows marked SIM and none marked
# NOSIM, that libgdrcache exports none of them, that no row is there twice, and that the probe
# tests/gpu/probes/entry_bytes.c (built on GPU machines on its own) still compiles with the table
# it includes by its relative path.
# Usage: check_entries.sh CC SOURCE-DIR LIBGDRCACHE FAKE-LIBCUDA...
set -eu
cc=$1 src=$2 lib=$3
shift 3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#define GDR_ENTRY(name, kind, route, fake, ...) name fake\n#include "%s"\n' \
	"$src/lib/intercept/entries.h" | "$cc" -E -P -x c - | awk 'NF' >"$tmp/rows"
awk '{print $1}' "$tmp/rows" | sort >"$tmp/all"
awk '$2 == "SIM" {print $1}' "$tmp/rows" | sort >"$tmp/sim"
fail=0
if [ ! -s "$tmp/all" ] || awk '$2 != "SIM" && $2 != "NOSIM"' "$tmp/rows" | grep .; then
	echo "FAIL: entries.h has no rows, or a row whose fake column is neither SIM nor NOSIM"; fail=1
fi
if uniq -d "$tmp/all" | grep .; then echo "FAIL: entries.h lists these twice"; fail=1; fi
exports() { nm -D --defined-only "$1" | awk '{print $NF}' | sed 's/@.*//' | sort -u; }
for fake in "$@"; do
	exports "$fake" | comm -12 "$tmp/all" - >"$tmp/got"
	if ! diff -u --label "entries.h SIM rows" --label "$fake" "$tmp/sim" "$tmp/got"; then
		echo "FAIL: $fake does not export exactly entries.h's SIM rows"; fail=1
	fi
done
if exports "$lib" | comm -12 "$tmp/all" - | grep .; then
	echo "FAIL: $lib exports CUDA driver entry points"; fail=1
fi
if ! "$cc" -fsyntax-only -Wall -Wextra -Werror "$src/tests/gpu/probes/entry_bytes.c"; then
	echo "FAIL: tests/gpu/probes/entry_bytes.c does not compile with entries.h"; fail=1
fi
[ $fail = 0 ] && echo "ok: $(wc -l <"$tmp/all") entry points, $(wc -l <"$tmp/sim") simulated by" \
	"each of $# fake drivers, none exported by the library, the probe compiles"
exit $fail
