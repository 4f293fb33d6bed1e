#!/bin/sh
# SPDX-License-Identifier: MIT
# A short perftest ib_write_bw run over rxe0 (RDMA WRITE, RC), server and client on the one device.
# vm-timeout: 180
port=18516
args="-d $GDR_VM_RXE_DEV -x $GDR_VM_GID -p $port -s 65536 -n 200 -F"
# shellcheck disable=SC2086 # $args is a word list
ib_write_bw $args >server.log 2>&1 &
server=$!
vm-wait-listen $port 30 || { cat server.log; exit 1; }
# shellcheck disable=SC2086
ib_write_bw $args 127.0.0.1 >client.log 2>&1
client_rc=$?
wait $server
server_rc=$?
echo "--- server (exit $server_rc)"; cat server.log
echo "--- client (exit $client_rc)"; cat client.log
[ $server_rc -eq 0 ] && [ $client_rc -eq 0 ] || exit 1
# The result row: bytes, iterations, peak and average BW (MB/s), msg rate; the average must be > 0.
awk '$1 == 65536 && $2 == 200 { ok = ($4 + 0 > 0) } END { exit !ok }' client.log
