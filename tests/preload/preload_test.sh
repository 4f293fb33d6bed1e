#!/bin/sh
# SPDX-License-Identifier: MIT
# The preload's host tests (ctest runs them; tests/preload/CMakeLists.txt passes the paths).
#   binding TEST OLD WRONG  with the REAL libibverbs, LD_BIND_NOW and LD_DEBUG=bindings: every
#                           interposed reference of a program built against today's headers (TEST,
#                           versioned: ibv_reg_mr@IBVERBS_1.1, ibv_reg_mr_iova2@IBVERBS_1.8, ...)
#                           and of one linked without versions (OLD) binds to the preload, and the
#                           preload finds libibverbs' own definitions; controls: without the preload
#                           they bind to libibverbs, and an interposer under another version node
#                           (WRONG) is skipped by versioned references
#   functional BACKEND TEST the cache behind the verbs calls, over the fake libibverbs (GDRCACHE_STATS=1)
#   disabled TEST           GDRCACHE_DISABLE=1: pure pass-through
#   old OLD                 the unversioned program over the fake: cached with the preload, not without
# Environment: GDRP_PRELOAD (the .so), GDRP_FAKEDIR (the fake libibverbs' directory), GDRP_SAN_RT
# (the sanitizer runtime to preload first in sanitized builds, or empty).
# Exit: 0 pass, 1 fail, 77 skip.
set -u
mode=$1
shift
preload="${GDRP_SAN_RT:+$GDRP_SAN_RT }$GDRP_PRELOAD"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

# bound LOG PROGRAM SYMBOL VERSION|- OBJECT: the program's reference to SYMBOL (with VERSION, or
# none for -) was bound to OBJECT (a pattern on its path).
bound() {
	if [ "$4" = - ]; then ver='$'; else ver=" \\[$4\\]\$"; fi
	grep -E "binding file [^ ]*$2 \\[0\\] to [^ ]*$5 \\[0\\]: normal symbol \`$3'$ver" "$1" >/dev/null
}

case $mode in
binding)
	test=$1 old=$2 wrong=$3
	real=$(ldconfig -p 2>/dev/null | awk '/libibverbs\.so\.1 .*x86-64/ { print $NF; exit }')
	if [ -z "$real" ] || ! objdump -T "$real" 2>/dev/null | grep -q 'IBVERBS_1.1 *ibv_reg_mr$'; then
		echo "no versioned system libibverbs.so.1 to bind against"
		exit 77
	fi
	tname=$(basename "$test") oname=$(basename "$old")
	# The preload exports exactly libibverbs' registration entry points, each under its node.
	exports=$(objdump -T "$GDRP_PRELOAD" | awk '($2 == "g" || $2 == "w") && $4 != "*ABS*" && $4 != "*UND*" { print $(NF-1), $NF }' | sort)
	expected=$(printf '%s\n' "(IBVERBS_1.0) ibv_close_device" "(IBVERBS_1.0) ibv_dealloc_pd" \
		"(IBVERBS_1.0) ibv_dereg_mr" "(IBVERBS_1.0) ibv_reg_mr" "IBVERBS_1.1 ibv_close_device" \
		"IBVERBS_1.1 ibv_dealloc_pd" "IBVERBS_1.1 ibv_dereg_mr" "IBVERBS_1.1 ibv_reg_mr" \
		"IBVERBS_1.1 ibv_rereg_mr" "IBVERBS_1.12 ibv_reg_dmabuf_mr" "IBVERBS_1.7 ibv_reg_mr_iova" \
		"IBVERBS_1.8 ibv_reg_mr_iova2" | sort)
	if [ "$exports" = "$expected" ]; then
		pass "the preload exports the 12 entry points under libibverbs' nodes, nothing else"
	else
		fail "the preload's exports differ: $(echo "$exports" | tr '\n' ',')"
	fi
	for sym in "ibv_reg_mr IBVERBS_1.1" "ibv_reg_mr_iova IBVERBS_1.7" "ibv_reg_mr_iova2 IBVERBS_1.8" \
		"ibv_reg_dmabuf_mr IBVERBS_1.12" "ibv_rereg_mr IBVERBS_1.1" "ibv_dereg_mr IBVERBS_1.1" \
		"ibv_dealloc_pd IBVERBS_1.1" "ibv_close_device IBVERBS_1.1"; do
		set -- $sym
		objdump -T "$test" | grep -qE "\\($2\\) +$1\$" || fail "$tname does not refer to $1@$2"
	done
	objdump -T "$old" | grep -E ' ibv_' | grep -q 'IBVERBS' && fail "$oname has versioned references"

	LD_PRELOAD="$preload" LD_BIND_NOW=1 LD_DEBUG=bindings "$test" --bind-only 2>"$tmp/test.log" ||
		fail "$tname did not load with the preload"
	LD_PRELOAD="$preload" LD_BIND_NOW=1 LD_DEBUG=bindings "$old" --bind-only 2>"$tmp/old.log" ||
		fail "$oname did not load with the preload"
	for sym in "ibv_reg_mr IBVERBS_1.1" "ibv_reg_mr_iova IBVERBS_1.7" "ibv_reg_mr_iova2 IBVERBS_1.8" \
		"ibv_reg_dmabuf_mr IBVERBS_1.12" "ibv_rereg_mr IBVERBS_1.1" "ibv_dereg_mr IBVERBS_1.1" \
		"ibv_dealloc_pd IBVERBS_1.1" "ibv_close_device IBVERBS_1.1"; do
		set -- $sym
		if bound "$tmp/test.log" "$tname" "$1" "$2" libgdrcache-preload.so; then
			pass "today's headers: $1@$2 binds to the preload"
		else
			fail "today's headers: $1@$2 does not bind to the preload"
		fi
	done
	for sym in ibv_reg_mr ibv_dereg_mr ibv_dealloc_pd ibv_close_device; do
		if bound "$tmp/old.log" "$oname" "$sym" - libgdrcache-preload.so; then
			pass "unversioned: $sym binds to the preload"
		else
			fail "unversioned: $sym does not bind to the preload"
		fi
	done
	for sym in "ibv_reg_mr IBVERBS_1.0" "ibv_reg_mr IBVERBS_1.1" "ibv_reg_mr_iova2 IBVERBS_1.8" \
		"ibv_dereg_mr IBVERBS_1.0" "ibv_dereg_mr IBVERBS_1.1" "ibv_close_device IBVERBS_1.0"; do
		set -- $sym
		if bound "$tmp/test.log" libgdrcache-preload.so "$1" "$2" libibverbs.so.1; then
			pass "the preload finds libibverbs' $1@$2"
		else
			fail "the preload does not find libibverbs' $1@$2"
		fi
	done
	# Controls: the same check fails where it must.
	LD_PRELOAD="$GDRP_SAN_RT" LD_BIND_NOW=1 LD_DEBUG=bindings "$test" --bind-only 2>"$tmp/none.log"
	if bound "$tmp/none.log" "$tname" ibv_reg_mr IBVERBS_1.1 libibverbs.so.1; then
		pass "control: without the preload ibv_reg_mr@IBVERBS_1.1 binds to libibverbs"
	else
		fail "control: without the preload ibv_reg_mr@IBVERBS_1.1 does not bind to libibverbs"
	fi
	LD_PRELOAD="${GDRP_SAN_RT:+$GDRP_SAN_RT }$wrong" LD_BIND_NOW=1 LD_DEBUG=bindings "$test" --bind-only \
		2>"$tmp/wrong.log"
	if bound "$tmp/wrong.log" "$tname" ibv_reg_mr IBVERBS_1.1 libibverbs.so.1 &&
		! bound "$tmp/wrong.log" "$tname" ibv_reg_mr IBVERBS_1.1 "$(basename "$wrong")"; then
		pass "control: an ibv_reg_mr under another version node is skipped by ibv_reg_mr@IBVERBS_1.1"
	else
		fail "control: the wrong-node interposer was not skipped"
	fi
	;;
functional)
	backend=$1 test=$2
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=$backend GDRCACHE_STATS=1 \
		"$test" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	cat "$tmp/out" "$tmp/err"
	[ $rc -eq 77 ] && exit 77
	[ $rc -eq 0 ] || fail "test_preload exited $rc"
	grep -Eq 'gdrcache-preload\[[0-9]+\] stats: cached [1-9]' "$tmp/err" ||
		fail "GDRCACHE_STATS=1: no preload statistics with cached registrations"
	grep -Eq "gdrcache\\[[0-9]+\\] stats \\(.*backend $backend" "$tmp/err" ||
		fail "GDRCACHE_STATS=1: no statistics of the library's cache (backend $backend)"
	grep -Eq 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error' \
		"$tmp/err" && fail "sanitizer report"
	;;
disabled)
	test=$1
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_DISABLE=1 GDRCACHE_STATS=1 \
		"$test" --disabled >"$tmp/out" 2>"$tmp/err"
	rc=$?
	cat "$tmp/out" "$tmp/err"
	[ $rc -eq 77 ] && exit 77
	[ $rc -eq 0 ] || fail "test_preload --disabled exited $rc"
	grep -q 'stats (disabled): cached 0 ' "$tmp/err" || fail "no 'disabled' statistics line"
	grep -Eq 'gdrcache\[[0-9]+\] stats' "$tmp/err" && fail "a cache was created although disabled"
	;;
old)
	old=$1
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem "$old" --expect cached
	rc=$?
	[ $rc -eq 77 ] && exit 77
	[ $rc -eq 0 ] || fail "old_prog with the preload exited $rc"
	LD_PRELOAD="$GDRP_SAN_RT" LD_LIBRARY_PATH="$GDRP_FAKEDIR" "$old" --expect direct ||
		fail "old_prog without the preload failed"
	;;
*)
	echo "usage: preload_test.sh binding|functional|disabled|old ..."
	exit 2
	;;
esac
[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all passed"
