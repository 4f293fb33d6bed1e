#!/bin/sh
# SPDX-License-Identifier: MIT
# perftest's ib_write_bw unchanged under LD_PRELOAD=libgdrcache-preload.so: the same run as 12,
# without and with the preload in both processes; both give the result row (65536 bytes, 200
# iterations, average bandwidth > 0), and the preload was loaded (GDRCACHE_STATS=1).
# vm-timeout: 240
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
[ -f "$PRELOAD" ] || { echo "libgdrcache-preload.so not built"; exit 77; }
args="-d $GDR_VM_RXE_DEV -x $GDR_VM_GID -p 18518 -s 65536 -n 200 -F"
row() { awk '$1 == 65536 && $2 == 200 && $4 + 0 > 0 { print $1, $2; ok = 1 } END { exit !ok }' "$1"; }
# shellcheck disable=SC2086 # $args is split on purpose
vm-server-client 18518 ib_write_bw $args || { echo "without the preload: failed"; exit 1; }
without=$(row client.log) || { echo "without the preload: no result row"; exit 1; }
mkdir -p plain && mv server.log client.log plain/

# shellcheck disable=SC2086
LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1 vm-server-client 18518 ib_write_bw $args ||
	{ echo "with the preload: failed"; exit 1; }
with=$(row client.log) || { echo "with the preload: no result row"; exit 1; }
[ "$with" = "$without" ] || { echo "result rows differ: '$without' / '$with'"; exit 1; }
for end in server client; do
	grep -Eq 'gdrcache-preload\[[0-9]+\] stats: .*passthrough_host [1-9]' $end.log ||
		{ echo "$end: the preload was not loaded or saw no registration"; exit 1; }
done
! grep -Eq 'gdrcache-preload.*(error|warn)' server.log client.log
