#!/bin/sh
# SPDX-License-Identifier: MIT
# ibv_rc_pingpong unchanged under LD_PRELOAD=libgdrcache-preload.so: the same run as 11, once
# without and once with the preload (both ends), the same outcome (exit 0, 200 iterations, data
# checked with -c), and the preload loaded in both processes (GDRCACHE_STATS=1 prints its counters:
# pingpong's buffers are host memory, so they pass straight through and no cache is made).
# vm-timeout: 180
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
[ -f "$PRELOAD" ] || { echo "libgdrcache-preload.so not built"; exit 77; }
args="-d $GDR_VM_RXE_DEV -g $GDR_VM_GID -p 18517 -n 200 -c"
# shellcheck disable=SC2086 # $args is split on purpose
vm-server-client 18517 ibv_rc_pingpong $args || { echo "without the preload: failed"; exit 1; }
grep -q '200 iters in' client.log && grep -q '200 iters in' server.log || exit 1
mkdir -p plain && mv server.log client.log plain/

# shellcheck disable=SC2086
LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1 vm-server-client 18517 ibv_rc_pingpong $args ||
	{ echo "with the preload: failed"; exit 1; }
for end in server client; do
	grep -q '200 iters in' $end.log || { echo "$end: no '200 iters in' with the preload"; exit 1; }
	grep -Eq 'gdrcache-preload\[[0-9]+\] stats: .*passthrough_host [1-9]' $end.log ||
		{ echo "$end: the preload was not loaded or saw no registration"; exit 1; }
	# the same bytes and iterations as without the preload
	a=$(grep -o '[0-9]* bytes in' plain/$end.log) b=$(grep -o '[0-9]* bytes in' $end.log)
	[ -n "$a" ] && [ "$a" = "$b" ] || { echo "$end: '$a' without, '$b' with the preload"; exit 1; }
done
! grep -Eq 'gdrcache-preload.*(error|warn)' server.log client.log
