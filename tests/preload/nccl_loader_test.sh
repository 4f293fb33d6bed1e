#!/bin/sh
# SPDX-License-Identifier: MIT
# NCCL's and UCCL's loaders pointed at the preload (ctest preload_nccl_loader*; nccl_loader_prog.c
# says what each run checks): NCCL_IBVERBS_LIB=libgdrcache-preload.so, without LD_PRELOAD, gives
# every verb of NCCL's table (preload/nccl_verbs.h), the registration entry points from the preload
# and the rest from libibverbs, and they work; the baseline (the variable unset, or naming
# libibverbs) gets libibverbs' own throughout.
#   nccl_loader_test.sh fake PROG  over the fake libibverbs (today's nodes and rdma-core 44's), the
#                                  verbs used; UCCL's variant (UCCL_IBV_SO, dlsym); the preload
#                                  also in LD_PRELOAD
#   nccl_loader_test.sh real PROG  over the installed libibverbs, resolution only (no device); 77
#                                  without a versioned libibverbs.so.1
# Environment: GDRP_PRELOAD, GDRP_FAKEDIR, GDRP_FAKEDIR44, GDRP_SAN_RT (as preload_test.sh).
# Exit: 0 pass, 1 fail, 77 skip.
set -u
mode=$1 prog=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }

# run WHAT LIBDIR PRELOAD VAR=VALUE|- ARGS...: the program over LIBDIR's libibverbs (- : the
# loader's own search) with LD_PRELOAD=PRELOAD and VAR set (- : NCCL_IBVERBS_LIB unset); it must
# exit 0 and write nothing on stderr.
run() {
	what=$1 dir=$2 pre=$3 var=$4
	shift 4
	echo "# $what"
	[ "$dir" = - ] && dir=
	[ "$var" = - ] && var=GDRP_UNUSED=
	env -u NCCL_IBVERBS_LIB -u UCCL_IBV_SO -u GDRCACHE_LOG LD_PRELOAD="$pre" \
		${dir:+LD_LIBRARY_PATH="$dir"} GDRCACHE_BACKEND=peermem "$var" "$prog" "$@" \
		2>"$tmp/err"
	rc=$?
	cat "$tmp/err"
	[ $rc -eq 0 ] || fail "$what: exited $rc"
	[ -s "$tmp/err" ] && fail "$what: wrote on stderr"
}

# The route's premise: the preload's own dependency tree holds libibverbs, whatever libgdrcache's
# links (a dlvsym on its handle searches that tree); and the program links no libibverbs.
if objdump -p "$GDRP_PRELOAD" | grep -qE 'NEEDED +libibverbs\.so\.1$'; then
	pass "libgdrcache-preload.so has libibverbs.so.1 in its own DT_NEEDED"
else
	fail "libgdrcache-preload.so does not need libibverbs.so.1 itself"
fi
objdump -p "$prog" | grep -qE 'NEEDED +libibverbs' && fail "$(basename "$prog") links libibverbs"

san=${GDRP_SAN_RT:-}
case $mode in
fake)
	for core in new 44; do
		dir=$GDRP_FAKEDIR
		[ $core = 44 ] && dir=$GDRP_FAKEDIR44
		run "rdma-core $core: NCCL_IBVERBS_LIB=the preload" "$dir" "$san" \
			NCCL_IBVERBS_LIB="$GDRP_PRELOAD" --expect preload
		run "rdma-core $core: NCCL_IBVERBS_LIB unset" "$dir" "$san" - --expect libibverbs
		run "rdma-core $core: NCCL_IBVERBS_LIB=libibverbs" "$dir" "$san" \
			NCCL_IBVERBS_LIB="$dir/libibverbs.so.1" --expect libibverbs
	done
	run "UCCL_IBV_SO=the preload (dlsym)" "$GDRP_FAKEDIR" "$san" UCCL_IBV_SO="$GDRP_PRELOAD" \
		--env UCCL_IBV_SO --dlsym --expect preload
	run "UCCL_IBV_SO unset (dlsym)" "$GDRP_FAKEDIR" "$san" - --env UCCL_IBV_SO --dlsym \
		--expect libibverbs
	run "NCCL_IBVERBS_LIB=the preload, and LD_PRELOAD too" "$GDRP_FAKEDIR" \
		"${san:+$san }$GDRP_PRELOAD" NCCL_IBVERBS_LIB="$GDRP_PRELOAD" --expect preload
	;;
real)
	real=$(ldconfig -p 2>/dev/null | awk '/libibverbs\.so\.1 / { print $NF; exit }')
	if [ -z "$real" ] ||
		! objdump -T "$real" 2>/dev/null | grep -q 'IBVERBS_1.1 *ibv_reg_mr$'; then
		echo "no versioned system libibverbs.so.1"
		exit 77
	fi
	run "$real: NCCL_IBVERBS_LIB=the preload" - "$san" NCCL_IBVERBS_LIB="$GDRP_PRELOAD" \
		--expect preload --device none
	run "$real: NCCL_IBVERBS_LIB unset" - "$san" - --expect libibverbs --device none
	;;
*)
	echo "usage: nccl_loader_test.sh fake|real PROG" >&2
	exit 2
	;;
esac
[ $fails -eq 0 ] || { echo "$fails failed"; exit 1; }
exit 0
