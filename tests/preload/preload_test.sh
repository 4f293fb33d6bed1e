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
#                           dlsym and dlvsym, under glibc's nodes, also bind to the preload
#   functional BACKEND TEST the cache behind the verbs calls, over the fake libibverbs (GDRCACHE_STATS=1);
#                           no error or warning line on stderr
#   functional44 TEST       the same over a libibverbs without today's nodes (rdma-core 44): the
#                           preload's definitions for what it lacks break nothing
#   disabled TEST           GDRCACHE_DISABLE=1: pure pass-through
#   old OLD                 the unversioned program over the fake: cached with the preload, not without
#   dlopen DL               a program without libibverbs in DT_NEEDED dlopens it by each name and by
#                           path (NCCL_IBVERBS_LIB), resolves with dlvsym at NCCL's versions and dlsym:
#                           cached with the preload, libibverbs' own without, passed through with
#                           GDRCACHE_DISABLE, over today's rdma-core and 44
#   early EARLY             verbs resolved in a linked library's constructor, before the preload's;
#                           resolved past the preload (libc's own dlvsym): libibverbs' MRs throughout
#   deepbind DEEP LIB       a plugin (LIB) linking libibverbs, dlopened with RTLD_DEEPBIND: its verbs
#                           are libibverbs' own with and without the preload, and so are its MRs
#                           (libibverbs' ibv_reg_mr calls ibv_reg_mr_iova2 through its own PLT)
#   next NEXT               RTLD_NEXT through the preload's dlsym and dlvsym still finds the next object
#   newnodes NEW            ibv_reg_mr_ex@IBVERBS_1.15, ibv_reg_buf_mr@IBVERBS_1.17 bind to the preload
#                           (LD_DEBUG); cached / passed through as they must be
#   config TEST SAME LOG    every GDRCACHE_* variable means in the preload what it means in the
#                           library (one parser, one logger): GDRCACHE_LOG=3 is info in both,
#                           GDRCACHE_STATS=off prints nothing, GDRCACHE_DISABLE=no caches, a
#                           malformed value is refused with the library's message and passes
#                           through; GDRCACHE_LOG_FILE takes the preload's lines too;
#                           GDRCACHE_STATS_SIGNAL writes the preload's counters; a program
#                           linking the library (LOG) that chose a log level keeps it under the
#                           preload (the preload quiets the library only where nobody chose one)
#   nocuda NOCUDA           a program that never loads the CUDA driver: 200 host registrations make
#                           the loader search for libcuda.so.1 at most once (LD_DEBUG=libs), and
#                           get libibverbs' own MRs; the preload makes no shadow record (records 0)
#   relro RELRO DIR         libibverbs linked -z now (DIR: the fake of fakeverbs_relro/, its RELRO
#                           pages left writable as a 64 KiB-page loader leaves the last one): the
#                           preload's write to its relocation slot gives the page back the
#                           protection it had, and a write there does not fault (relro_prog.c)
#   stress STRESS           shadow records under threads (stress_prog.c: releases on other threads,
#                           concurrent double releases, a device closed under held shadows, fork()
#                           while threads register); every shadow released exactly once (the
#                           preload's released == cached), the records it made bounded by the
#                           shadows live at once, not by the registrations
#   same SAME               the same stdout (every call's outcome) and the same stderr with and without
#                           the preload, over today's rdma-core and 44
# Environment: GDRP_PRELOAD (the .so), GDRP_FAKEDIR / GDRP_FAKEDIR44 (the fake libibverbs'
# directories: today's nodes, rdma-core 44's), GDRP_SAN_RT (the sanitizer runtime to preload first
# in sanitized builds, or empty).
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
# run_stats LIBDIR BACKEND PROG: PROG under the preload over LIBDIR's libibverbs, with statistics;
# its output in $tmp/out and $tmp/err (both shown), its status in rc; a skip (77) skips the case.
run_stats() {
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$1" GDRCACHE_BACKEND=$2 GDRCACHE_STATS=1 \
		"$3" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	cat "$tmp/out" "$tmp/err"
	[ $rc -eq 77 ] && exit 77
}

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
	# The preload exports exactly libibverbs' registration entry points, each under its node,
	# and dlsym / dlvsym under the nodes libc.so.6 has them at (GLIBC_2.34 and the compat one).
	libc=$(ldconfig -p 2>/dev/null | awk '/libc\.so\.6 .*x86-64/ { print $NF; exit }')
	compat=$(objdump -T "$libc" | awk '$NF == "dlsym" && $(NF-1) ~ /^\(GLIBC_/ { gsub(/[()]/, "", $(NF-1)); print $(NF-1) }')
	[ -n "$compat" ] || fail "no compat dlsym in $libc"
	exports=$(objdump -T "$GDRP_PRELOAD" | awk '($2 == "g" || $2 == "w") && $4 != "*ABS*" && $4 != "*UND*" { print $(NF-1), $NF }' | sort)
	expected=$(printf '%s\n' "(IBVERBS_1.0) ibv_close_device" "(IBVERBS_1.0) ibv_dealloc_pd" \
		"(IBVERBS_1.0) ibv_dereg_mr" "(IBVERBS_1.0) ibv_reg_mr" "IBVERBS_1.1 ibv_close_device" \
		"IBVERBS_1.1 ibv_dealloc_pd" "IBVERBS_1.1 ibv_dereg_mr" "IBVERBS_1.1 ibv_reg_mr" \
		"IBVERBS_1.1 ibv_rereg_mr" "IBVERBS_1.12 ibv_reg_dmabuf_mr" "IBVERBS_1.7 ibv_reg_mr_iova" \
		"IBVERBS_1.8 ibv_reg_mr_iova2" "IBVERBS_1.15 ibv_reg_mr_ex" "IBVERBS_1.17 ibv_reg_buf_mr" \
		"GLIBC_2.34 dlsym" "GLIBC_2.34 dlvsym" "($compat) dlsym" "($compat) dlvsym" | sort)
	if [ "$exports" = "$expected" ]; then
		pass "the preload exports the 14 entry points under libibverbs' nodes, dlsym and dlvsym under GLIBC_2.34 and $compat, nothing else"
	else
		fail "the preload's exports differ: $(echo "$exports" | tr '\n' ',')"
	fi
	objdump -p "$GDRP_PRELOAD" | awk '/Version definitions/ { d = 1 } d && $1 == 2 { print $4; exit }' |
		grep -qx IBVERBS_1.0 || fail "IBVERBS_1.0 is not version index 2"
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
	for sym in dlsym dlvsym; do
		if bound "$tmp/test.log" "$tname" "$sym" GLIBC_2.34 libgdrcache-preload.so; then
			pass "$sym@GLIBC_2.34 binds to the preload"
		else
			fail "$sym@GLIBC_2.34 does not bind to the preload"
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
	run_stats "$GDRP_FAKEDIR" $backend "$test"
	[ $rc -eq 0 ] || fail "test_preload exited $rc"
	grep -Eq 'gdrcache-preload\[[0-9]+\] stats: cached [1-9]' "$tmp/err" ||
		fail "GDRCACHE_STATS=1: no preload statistics with cached registrations"
	grep -Eq "gdrcache\\[[0-9]+\\] stats \\(.*backend $backend" "$tmp/err" ||
		fail "GDRCACHE_STATS=1: no statistics of the library's cache (backend $backend)"
	grep -Eq 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error' \
		"$tmp/err" && fail "sanitizer report"
	grep -E '^gdrcache(-preload)?\[[0-9]+\] (error|warn):' "$tmp/err" &&
		fail "error or warning lines for calls that end as they would without the preload"
	;;
functional44)
	test=$1
	run_stats "$GDRP_FAKEDIR44" peermem "$test"
	objdump -T "$GDRP_FAKEDIR44/libibverbs.so.1" | grep -q 'IBVERBS_1.15' &&
		fail "the rdma-core 44 fake has IBVERBS_1.15"
	[ $rc -eq 0 ] || fail "test_preload over rdma-core 44's nodes exited $rc"
	grep -Eq 'gdrcache-preload\[[0-9]+\] stats: cached [1-9]' "$tmp/err" ||
		fail "no cached registrations over rdma-core 44's nodes"
	grep -E '^gdrcache(-preload)?\[[0-9]+\] (error|warn):' "$tmp/err" &&
		fail "error or warning lines"
	;;
dlopen)
	dl=$1
	objdump -p "$dl" | grep -E 'NEEDED +libibverbs' && fail "$(basename "$dl") links libibverbs"
	mkdir "$tmp/lib" && ln -s "$GDRP_FAKEDIR/libibverbs.so.1" "$tmp/lib/libibverbs-nccl.so"
	# dlopen by both names NCCL tries, by the fake's own path and by another path to the same
	# file (what NCCL_IBVERBS_LIB names)
	libs="libibverbs.so libibverbs.so.1 $GDRP_FAKEDIR/libibverbs.so.1 $tmp/lib/libibverbs-nccl.so"
	for run in "cached new $GDRP_FAKEDIR $preload" "direct new $GDRP_FAKEDIR $GDRP_SAN_RT" \
		"cached 44 $GDRP_FAKEDIR44 $preload" "direct 44 $GDRP_FAKEDIR44 $GDRP_SAN_RT" \
		"disabled new $GDRP_FAKEDIR $preload disabled"; do
		set -- $run
		expect=$1 core=$2 dir=$3
		shift 3
		pre="$*" dis=
		case $pre in *disabled) pre=${pre% disabled} dis=1 ;; esac
		[ "$dir" = "$GDRP_FAKEDIR44" ] && l44="libibverbs.so.1 $GDRP_FAKEDIR44/libibverbs.so.1" || l44=$libs
		echo "# $expect, rdma-core $core, LD_PRELOAD=$pre${dis:+, GDRCACHE_DISABLE=1}"
		env -u GDRCACHE_LOG LD_PRELOAD="$pre" LD_LIBRARY_PATH="$dir" GDRCACHE_BACKEND=peermem \
			${dis:+GDRCACHE_DISABLE=1} "$dl" --expect "$expect" --rdma-core "$core" $l44 \
			2>"$tmp/err"
		rc=$?
		cat "$tmp/err"
		[ $rc -eq 0 ] || fail "dl_prog --expect $expect over rdma-core $core exited $rc"
		[ -s "$tmp/err" ] && fail "dl_prog wrote on stderr"
	done
	;;
early)
	early=$1
	env -u GDRCACHE_LOG LD_PRELOAD="$GDRP_SAN_RT" LD_LIBRARY_PATH="$GDRP_FAKEDIR" "$early" \
		--expect direct || fail "early_prog without the preload"
	env -u GDRCACHE_LOG LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem \
		"$early" --expect cached || fail "early_prog with the preload"
	env -u GDRCACHE_LOG LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_DISABLE=1 \
		"$early" --expect disabled || fail "early_prog with the preload and GDRCACHE_DISABLE=1"
	;;
deepbind)
	deep=$1 lib=$2
	env -u GDRCACHE_LOG LD_PRELOAD="$GDRP_SAN_RT" LD_LIBRARY_PATH="$GDRP_FAKEDIR" "$deep" "$lib" ||
		fail "deep_prog without the preload"
	env -u GDRCACHE_LOG LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem \
		"$deep" "$lib" || fail "deep_prog with the preload"
	;;
next)
	next=$1
	LD_PRELOAD="$GDRP_SAN_RT" "$next" --expect libc || fail "next_prog without the preload"
	LD_PRELOAD="$preload" "$next" --expect preload || fail "next_prog with the preload"
	;;
newnodes)
	new=$1
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" LD_BIND_NOW=1 LD_DEBUG=bindings "$new" \
		--bind-only 2>"$tmp/bind.log" || fail "new_prog did not load with the preload"
	nname=$(basename "$new")
	for sym in "ibv_reg_mr_ex IBVERBS_1.15" "ibv_reg_buf_mr IBVERBS_1.17"; do
		set -- $sym
		if bound "$tmp/bind.log" "$nname" "$1" "$2" libgdrcache-preload.so; then
			pass "$1@$2 binds to the preload"
		else
			fail "$1@$2 does not bind to the preload"
		fi
	done
	if bound "$tmp/bind.log" "$nname" ibv_alloc_buf IBVERBS_1.17 libibverbs.so.1; then
		pass "ibv_alloc_buf@IBVERBS_1.17 (not a registration) stays libibverbs'"
	else
		fail "ibv_alloc_buf@IBVERBS_1.17 does not bind to libibverbs"
	fi
	env -u GDRCACHE_LOG LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem \
		"$new" --expect cached 2>"$tmp/err" || fail "new_prog with the preload"
	cat "$tmp/err"
	[ -s "$tmp/err" ] && fail "new_prog wrote on stderr"
	LD_PRELOAD="$GDRP_SAN_RT" LD_LIBRARY_PATH="$GDRP_FAKEDIR" "$new" --expect direct ||
		fail "new_prog without the preload"
	;;
nocuda)
	prog=$1
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" LD_DEBUG=libs GDRCACHE_STATS=1 "$prog" 200 \
		>"$tmp/out" 2>"$tmp/dbg"
	rc=$?
	[ $rc -eq 77 ] && exit 77
	n=$(grep -c 'find library=libcuda\.so\.1' "$tmp/dbg")
	if [ $rc -eq 0 ] && grep -q '^200 host registrations$' "$tmp/out"; then
		pass "200 host registrations under the preload, CUDA never loaded"
	else
		fail "the program failed (exit $rc)"
	fi
	if [ "$n" -le 1 ]; then
		pass "the loader searched for libcuda.so.1 $n time(s) (at most once)"
	else
		fail "the loader searched for libcuda.so.1 $n times for 200 registrations"
	fi
	if grep -Eq 'gdrcache-preload\[[0-9]+\] stats: .* records 0( |$)' "$tmp/dbg"; then
		pass "no shadow record made (its arena never reserved)"
	else
		fail "shadow records made, or no statistics: $(grep 'gdrcache-preload\[' "$tmp/dbg")"
	fi
	;;
relro)
	prog=$1 dir=$2
	# without the preload first: the fake's RELRO pages are left writable (the control)
	LD_LIBRARY_PATH="$dir" "$prog" >"$tmp/out" 2>&1
	rc=$?
	cat "$tmp/out"
	[ $rc -eq 77 ] && exit 77
	[ $rc -eq 0 ] || fail "without the preload: exit $rc (the fake did not leave its RELRO writable)"
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$dir" GDRCACHE_LOG=info "$prog" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	cat "$tmp/out" "$tmp/err"
	if [ $rc -eq 0 ]; then
		pass "the page of libibverbs' slot kept its protection under the preload"
	else
		fail "under the preload: exit $rc"
	fi
	;;
stress)
	prog=$1
	run_stats "$GDRP_FAKEDIR" peermem "$prog"
	[ $rc -eq 0 ] || fail "stress_prog exited $rc"
	line=$(grep -E 'gdrcache-preload\[[0-9]+\] stats: ' "$tmp/err" | tail -1)
	val() { echo "$line" | sed -nE "s/.* $1 ([0-9]+)( .*)?\$/\\1/p"; }
	out() { sed -n "s/^$1 //p" "$tmp/out"; }
	cached=$(val cached) released=$(val released) records=$(val records)
	live=$(out 'max live shadows') threads=$(out threads) regs=$(out registrations)
	if [ -z "$cached" ] || [ -z "$records" ] || [ -z "$live" ]; then
		fail "no statistics, or no figures from stress_prog"
	else
		if [ "$cached" -ge "$regs" ] && [ "$released" -eq "$cached" ]; then
			pass "$cached shadows handed out, each released exactly once"
		else
			fail "shadows: cached $cached, released $released, registrations $regs"
		fi
		# the preload keeps at most about a hundred free records a thread
		bound=$((live + 128 * threads))
		if [ "$records" -le "$bound" ] && [ $((records * 10)) -lt "$regs" ]; then
			pass "$records shadow records for $regs registrations ($live live at most, $threads threads)"
		else
			fail "$records shadow records for $regs registrations: more than $bound"
		fi
	fi
	grep -Eq 'ERROR: (AddressSanitizer|LeakSanitizer)|WARNING: ThreadSanitizer|runtime error' \
		"$tmp/err" && fail "sanitizer report"
	grep -E '^gdrcache(-preload)?\[[0-9]+\] (error|warn):' "$tmp/err" && fail "error or warning lines"
	;;
same)
	same=$1
	for dir in "$GDRP_FAKEDIR" "$GDRP_FAKEDIR44"; do
		for b in peermem dmabuf; do
			env -u GDRCACHE_LOG -u GDRCACHE_STATS LD_PRELOAD="$GDRP_SAN_RT" \
				LD_LIBRARY_PATH="$dir" "$same" >"$tmp/out0" 2>"$tmp/err0"
			rc0=$?
			env -u GDRCACHE_LOG -u GDRCACHE_STATS LD_PRELOAD="$preload" LD_LIBRARY_PATH="$dir" \
				GDRCACHE_BACKEND=$b "$same" >"$tmp/out1" 2>"$tmp/err1"
			rc1=$?
			[ $rc0 -eq 77 ] && exit 77
			what="$(basename "$dir"), backend $b"
			if [ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] && cmp -s "$tmp/out0" "$tmp/out1"; then
				pass "$what: every call's outcome is the same with the preload"
			else
				fail "$what: outcomes differ (exit $rc0 / $rc1)"
				diff "$tmp/out0" "$tmp/out1"
			fi
			if cmp -s "$tmp/err0" "$tmp/err1"; then
				pass "$what: and so is stderr"
			else
				fail "$what: stderr differs"
				diff "$tmp/err0" "$tmp/err1"
			fi
		done
	done
	cat "$tmp/out1"
	# Control: the preload has things to say about these calls, at info.
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_LOG=info GDRCACHE_BACKEND=peermem \
		"$same" >/dev/null 2>"$tmp/err1"
	if grep -q '^gdrcache\[[0-9:]*\] [^ ]* info: ibv_rereg_mr of a cached MR: the provider refuses' \
		"$tmp/err1"; then
		pass "control: with GDRCACHE_LOG=info the preload says why"
	else
		fail "control: nothing said at GDRCACHE_LOG=info"
	fi
	;;
config)
	test=$1 same=$2 loglevel=$3
	# A program that links the library and chose its level: the library's error lines before
	# and after the preload's first GPU registration (which creates the preload's cache), as
	# without the preload; one that chose none: quiet from then on, under the preload only.
	for how in chose default; do
		for pre in "$GDRP_SAN_RT" "$preload"; do
			env -u GDRCACHE_LOG LD_PRELOAD="$pre" LD_LIBRARY_PATH="$GDRP_FAKEDIR" \
				GDRCACHE_BACKEND=peermem "$loglevel" $how >/dev/null 2>"$tmp/err"
			rc=$?
			[ $rc -eq 77 ] && exit 77
			n=$(grep -c 'error: .*reserved' "$tmp/err")
			want=2
			[ $how = default ] && [ "$pre" = "$preload" ] && want=1
			what="a program that links the library, level $how, ${pre:+under the preload}"
			if [ $rc -eq 0 ] && [ "$n" -eq $want ]; then
				pass "$what: $n error lines of the library"
			else
				fail "$what: exit $rc, $n error lines of the library (want $want)"
				cat "$tmp/err"
			fi
		done
	done
	# GDRCACHE_LOG=3 is info, in the library's parser and so in the preload (which once knew
	# only the names): the same info lines as with GDRCACHE_LOG=info.
	for lvl in info 3; do
		LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_LOG=$lvl \
			GDRCACHE_BACKEND=peermem "$same" >/dev/null 2>"$tmp/err.$lvl"
		grep ' info: ' "$tmp/err.$lvl" | sed 's/^.* info: /info: /; s/ ([a-z_0-9]*:[0-9].*)$//' |
			sed 's/0x[0-9a-f]*/0x/g' | sort -u >"$tmp/info.$lvl"
	done
	if grep -q 'ibv_rereg_mr of a cached MR: the provider refuses' "$tmp/info.3" &&
		cmp -s "$tmp/info.info" "$tmp/info.3"; then
		pass "GDRCACHE_LOG=3: the preload's info lines, as with GDRCACHE_LOG=info"
	else
		fail "GDRCACHE_LOG=3 and GDRCACHE_LOG=info differ in the preload"
		diff "$tmp/info.info" "$tmp/info.3"
	fi
	# GDRCACHE_STATS=off: no statistics, from the library or the preload (the preload once took
	# any value but "0" as on).
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem GDRCACHE_STATS=off \
		"$test" >"$tmp/out" 2>"$tmp/err"
	rc=$?
	[ $rc -eq 77 ] && exit 77
	[ $rc -eq 0 ] || fail "test_preload with GDRCACHE_STATS=off exited $rc"
	if grep -E 'stats' "$tmp/err"; then
		fail "GDRCACHE_STATS=off printed statistics"
	else
		pass "GDRCACHE_STATS=off: no statistics from the preload or the library"
	fi
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem GDRCACHE_STATS=on \
		"$test" >"$tmp/out" 2>"$tmp/err"
	if grep -Eq 'gdrcache-preload\[[0-9]+\] stats: cached [1-9]' "$tmp/err" &&
		grep -Eq 'gdrcache\[[0-9]+\] stats \(' "$tmp/err"; then
		pass "control: GDRCACHE_STATS=on prints both"
	else
		fail "GDRCACHE_STATS=on: not both statistics lines"
	fi
	# GDRCACHE_DISABLE=no caches (it once disabled); a malformed value is refused by name, and
	# everything passes through (no cache can be made), with nothing broken.
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem GDRCACHE_DISABLE=no \
		GDRCACHE_STATS=1 "$test" >"$tmp/out" 2>"$tmp/err"
	if [ $? -eq 0 ] && grep -Eq 'gdrcache-preload\[[0-9]+\] stats: cached [1-9]' "$tmp/err"; then
		pass "GDRCACHE_DISABLE=no: cached"
	else
		fail "GDRCACHE_DISABLE=no did not cache"
	fi
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_BACKEND=peermem \
		GDRCACHE_DISABLE=maybe "$test" --disabled >"$tmp/out" 2>"$tmp/err"
	rc=$?
	if [ $rc -eq 0 ] && grep -q 'GDRCACHE_DISABLE="maybe" is malformed: it must be' "$tmp/err"; then
		pass "GDRCACHE_DISABLE=maybe: refused by name, every registration libibverbs' own"
	else
		fail "GDRCACHE_DISABLE=maybe: exit $rc, or no message"
		cat "$tmp/err"
	fi
	# GDRCACHE_STATS_SIGNAL: the preload's counters on the signal too, the program goes on.
	# The library's thread writes them when it gets to run: bash waits until they are in its
	# stderr (a file), running commands meanwhile (each rebuilds its environment), 120 s at most.
	sigre='gdrcache-preload\[[0-9]+\] stats \(signal\): cached 0 '
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_STATS=1 \
		GDRCACHE_STATS_SIGNAL=USR1 bash -c 'kill -USR1 $$; i=0
			until grep -Eq "$1" "$2" || [ $i -ge 1200 ]; do sleep 0.1; i=$((i + 1)); done
			echo alive' sh "$sigre" "$tmp/sig.err" >"$tmp/sig.out" 2>"$tmp/sig.err"
	out=$(cat "$tmp/sig.out" "$tmp/sig.err")
	if grep -Eq "$sigre" "$tmp/sig.err" && grep -qx alive "$tmp/sig.out"; then
		pass "GDRCACHE_STATS_SIGNAL=USR1: the preload's statistics on the signal"
	else
		fail "GDRCACHE_STATS_SIGNAL=USR1 under the preload: $out"
	fi
	# GDRCACHE_LOG_FILE (%p): the preload's lines and the library's go there, not to stderr.
	LD_PRELOAD="$preload" LD_LIBRARY_PATH="$GDRP_FAKEDIR" GDRCACHE_LOG=info \
		GDRCACHE_LOG_FILE="$tmp/log.%p" GDRCACHE_BACKEND=peermem "$same" >/dev/null 2>"$tmp/err"
	if [ ! -s "$tmp/err" ] && cat "$tmp/log."[0-9]* 2>/dev/null |
		grep -q 'info: ibv_rereg_mr of a cached MR: the provider refuses'; then
		pass "GDRCACHE_LOG_FILE=$tmp/log.%p: the preload's lines there, nothing on stderr"
	else
		fail "GDRCACHE_LOG_FILE: lines not in the file, or on stderr"
		cat "$tmp/err"
	fi
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
	echo "usage: preload_test.sh binding|functional|functional44|disabled|old|dlopen|early|deepbind|next|newnodes|same|config|nocuda|stress ..."
	exit 2
	;;
esac
[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all passed"
