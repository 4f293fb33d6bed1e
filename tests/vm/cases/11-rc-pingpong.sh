#!/bin/sh
# SPDX-License-Identifier: MIT
# A reliable-connection ping-pong over rxe0 with rdma-core's ibv_rc_pingpong: server and client on
# the one device, meeting at 127.0.0.1 (RoCE v2 GID of the veth address: $GDR_VM_GID); -c checks
# the received data.
# vm-timeout: 120
vm-server-client 18515 ibv_rc_pingpong -d "$GDR_VM_RXE_DEV" -g "$GDR_VM_GID" -p 18515 -n 200 -c || exit 1
grep -q 'bytes in .* seconds' client.log && grep -q '200 iters in' client.log
