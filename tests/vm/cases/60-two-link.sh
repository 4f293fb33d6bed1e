#!/bin/sh
# SPDX-License-Identifier: MIT
# Two guests (tests/vm/run --two, issue 32): the link between them and RoCE over it. Node 2
# answers ping and ssh; ibv_rc_pingpong's server runs on node 2 (started over vm-ssh), its client
# here connects to node 2's address, and the RDMA traffic must have crossed the link: this guest's
# NIC counted at least the payload in each direction (not loopback: rxe0 is on the NIC here and
# on the other guest, each with its own kernel, gdrcache.ko and simulated NVIDIA provider).
# vm-two: yes
# vm-timeout: 180
[ "$GDR_VM_NODE" = 1 ] || { echo "not node 1 of tests/vm/run --two"; exit 77; }
peer() { timeout 60 vm-ssh "$GDR_VM_PEER" "$@"; }
fail=0
ping -c 3 -W 5 "$GDR_VM_PEER_ADDR" || { echo "node 2 ($GDR_VM_PEER_ADDR) does not answer ping"; exit 1; }
peer uname -n || { echo "vm-ssh $GDR_VM_PEER failed"; exit 1; }
for m in gdrcache nvp2p_sim rdma_rxe; do
	peer test -d "/sys/module/$m" || { echo "node 2: module $m not loaded"; fail=1; }
done
peer cat /sys/class/infiniband/rxe0/ports/1/state | grep -q ACTIVE ||
	{ echo "node 2: rxe0 not ACTIVE"; fail=1; }
[ "$(cat /sys/class/infiniband/rxe0/ports/1/gids/0)" != "$(peer cat /sys/class/infiniband/rxe0/ports/1/gids/0)" ] ||
	{ echo "the two guests' rxe0 have the same GID 0: not two devices"; fail=1; }

# ibv_rc_pingpong: 200 round trips of 4 KiB, server on node 2, client here.
stat() { cat "/sys/class/net/$GDR_VM_NETDEV/statistics/$1"; }
tx0=$(stat tx_bytes) rx0=$(stat rx_bytes)
peer ibv_rc_pingpong -d "$GDR_VM_RXE_DEV" -g "$GDR_VM_GID" -p 18515 -s 4096 -n 200 >server.log 2>&1 &
server=$!
peer /tests/bin/vm-wait-listen 18515 60 || { cat server.log; echo "the server on node 2 does not listen"; exit 1; }
ibv_rc_pingpong -d "$GDR_VM_RXE_DEV" -g "$GDR_VM_GID" -p 18515 -s 4096 -n 200 "$GDR_VM_PEER_ADDR" \
	>client.log 2>&1
client_rc=$?
vm-wait-exit "$server" 60 "the ibv_rc_pingpong server on node 2" >/dev/null
wait "$server"
server_rc=$?
echo "--- server on node 2 (exit $server_rc)"; cat server.log
echo "--- client on node 1 (exit $client_rc)"; cat client.log
if [ $server_rc != 0 ] || [ $client_rc != 0 ]; then echo "ibv_rc_pingpong between the guests failed"; fail=1; fi
tx=$(($(stat tx_bytes) - tx0)) rx=$(($(stat rx_bytes) - rx0))
echo "$GDR_VM_NETDEV: $tx bytes sent, $rx bytes received during the ping-pong"
# 200 messages of 4096 bytes each way, at the least.
if [ $tx -lt 819200 ] || [ $rx -lt 819200 ]; then
	echo "the RDMA traffic did not cross the link between the guests"; fail=1
fi
exit $fail
