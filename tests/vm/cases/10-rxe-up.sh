#!/bin/sh
# SPDX-License-Identifier: MIT
# Soft-RoCE is up: ibv_devinfo sees rxe0 through libibverbs and its rxe provider, port ACTIVE.
out=$(ibv_devinfo -d "$GDR_VM_RXE_DEV" 2>&1)
rc=$?
echo "$out"
[ $rc -eq 0 ] || { echo "ibv_devinfo failed ($rc)"; exit 1; }
echo "$out" | grep -q "hca_id:[[:space:]]*$GDR_VM_RXE_DEV" || { echo "no $GDR_VM_RXE_DEV"; exit 1; }
echo "$out" | grep -q 'state:[[:space:]]*PORT_ACTIVE' || { echo "port not ACTIVE"; exit 1; }
echo "$out" | grep -q 'link_layer:[[:space:]]*Ethernet' || { echo "link layer not Ethernet"; exit 1; }
ibv_devices
rdma link show
