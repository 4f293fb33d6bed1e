#!/bin/sh
# SPDX-License-Identifier: MIT
# A reliable-connection ping-pong over rxe0 with rdma-core's ibv_rc_pingpong: server and client on
# the one device, meeting at 127.0.0.1 (RoCE v2 GID of the veth address: $GDR_VM_GID); -c checks
# the received data.
# vm-timeout: 120
port=18515
args="-d $GDR_VM_RXE_DEV -g $GDR_VM_GID -p $port -n 200 -c"
# shellcheck disable=SC2086 # $args is a word list
ibv_rc_pingpong $args >server.log 2>&1 &
server=$!
vm-wait-listen $port 30 || { cat server.log; exit 1; }
# shellcheck disable=SC2086
ibv_rc_pingpong $args 127.0.0.1 >client.log 2>&1
client_rc=$?
wait $server
server_rc=$?
echo "--- server (exit $server_rc)"; cat server.log
echo "--- client (exit $client_rc)"; cat client.log
[ $server_rc -eq 0 ] && [ $client_rc -eq 0 ] || exit 1
grep -q 'bytes in .* seconds' client.log && grep -q '200 iters in' client.log
