#!/bin/sh
# SPDX-License-Identifier: MIT
# The preload's edge cases (tests/preload/CMakeLists.txt passes the paths; GDRP_* as preload_test.sh).
#   prog PROG   edges_prog.c over the fake libibverbs, backends peermem and dmabuf, validation
#               modes tag and events (auto); no error or warning line on stderr
#   arena PROG  arena_full_prog.c: the preload's record arena full (RLIMIT_AS), over the fake
# Exit: 0 pass, 1 fail, 77 skip.
set -u
mode=$1
shift
preload="${GDRP_SAN_RT:+$GDRP_SAN_RT }$GDRP_PRELOAD"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
case $mode in
prog)
	prog=$1
	for b in peermem dmabuf; do
		for v in auto tag; do
			echo "== backend $b, validation $v"
			LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=$b \
				GDRCACHE_VALIDATE=$v GDRCACHE_STATS=1 "$prog" >"$tmp/out" 2>"$tmp/err"
			rc=$?
			cat "$tmp/out" "$tmp/err"
			[ $rc -eq 77 ] && exit 77
			[ $rc -eq 0 ] || fail "$(basename "$prog") exited $rc (backend $b, validation $v)"
			grep -Eq 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error' \
				"$tmp/err" && fail "sanitizer report"
			grep -E '^gdrcache(-preload)?\[[0-9]+\] (error|warn):' "$tmp/err" &&
				fail "error or warning lines"
		done
	done
	;;
arena)
	prog=$1
	if [ -n "${GDRP_SAN_RT:-}" ]; then
		echo "skipped: a sanitizer's shadow memory does not fit under the RLIMIT_AS the test sets"
		exit 77
	fi
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem \
		GDRCACHE_STATS=1 "$prog" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	cat "$tmp/out" "$tmp/err"
	[ $rc -eq 77 ] && exit 77
	[ $rc -eq 0 ] || fail "$(basename "$prog") exited $rc"
	grep -E '^gdrcache(-preload)?\[[0-9]+\] (error|warn):' "$tmp/err" && fail "error or warning lines"
	;;
*)
	echo "unknown mode $mode"
	exit 1
	;;
esac
[ $fails -eq 0 ]
