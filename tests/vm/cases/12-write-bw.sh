#!/bin/sh
# SPDX-License-Identifier: MIT
# A short perftest ib_write_bw run over rxe0 (RDMA WRITE, RC), server and client on the one device.
# vm-timeout: 180
vm-server-client 18516 ib_write_bw -d "$GDR_VM_RXE_DEV" -x "$GDR_VM_GID" -p 18516 -s 65536 -n 200 -F || exit 1
# The result row: bytes, iterations, peak and average BW (MB/s), msg rate; the average must be > 0.
awk '$1 == 65536 && $2 == 200 { ok = ($4 + 0 > 0) } END { exit !ok }' client.log
