#!/bin/sh
# SPDX-License-Identifier: MIT
# vm_mpi_pingpong across two guests (tests/vm/run --two, issue 32): mpirun with a hostfile starts
# one rank on each guest through its rsh launch agent (vm-ssh: dropbear), pml ucx over rxe0 and the
# link (UCX_TLS=rc,self), without and with LD_PRELOAD=libgdrcache-preload.so in both ranks. As
# case 51: the same 3 verified results (sizes, round trips, 0 payloads wrong) both ways, no error
# or warning, the preload loaded with registrations in both ranks; and the traffic crossed the link.
# vm-two: yes
# vm-timeout: 300
[ "$GDR_VM_NODE" = 1 ] || { echo "not node 1 of tests/vm/run --two"; exit 77; }
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
[ -f "$PRELOAD" ] || { echo "libgdrcache-preload.so not built"; exit 77; }
command -v mpirun.openmpi >/dev/null || { echo "Open MPI (openmpi-bin) not in the guest"; exit 77; }
command -v vm_mpi_pingpong >/dev/null || { echo "vm_mpi_pingpong not built (libopenmpi-dev)"; exit 77; }
export UCX_NET_DEVICES="$GDR_VM_RXE_DEV:1" UCX_TLS=rc,self UCX_IB_GID_INDEX=0
export UCX_WARN_UNUSED_ENV_VARS=n
# One rank on each guest; mpirun ends within 200 s or is ended (timeout: exit 124).
mpi() {
	timeout -k 10 200 mpirun.openmpi --allow-run-as-root -np 2 --hostfile "$GDR_VM_HOSTFILE" \
		--map-by node --bind-to none --display-map --mca plm_rsh_agent /tests/bin/vm-ssh \
		--mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include 10.77.0.0/24 \
		--mca pml ucx --mca btl self --mca osc '^ucx,pt2pt' \
		-x PATH -x UCX_NET_DEVICES -x UCX_TLS -x UCX_IB_GID_INDEX -x UCX_WARN_UNUSED_ENV_VARS "$@"
}
results() { grep '^vm_mpi_pingpong: ' "$1" | sed 's/;.*//'; }
rx() { cat "/sys/class/net/$GDR_VM_NETDEV/statistics/rx_bytes"; }
iters=${PINGPONG_ITERS:-20}

rx0=$(rx)
mpi /tests/bin/vm_mpi_pingpong "$iters" >plain.log 2>&1
rc=$?
cat plain.log
[ $rc -eq 0 ] || { echo "without the preload: exit $rc"; exit 1; }
got=$(($(rx) - rx0))
LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1 mpi -x LD_PRELOAD -x GDRCACHE_STATS /tests/bin/vm_mpi_pingpong \
	"$iters" >preload.log 2>&1
rc=$?
cat preload.log
[ $rc -eq 0 ] || { echo "with the preload: exit $rc"; exit 1; }
n=$(grep -Ec 'Data for node: gdrvm[12][[:space:]].*Num procs: 1' plain.log preload.log | awk -F: '{ s += $NF } END { print s }')
[ "$n" = 4 ] || { echo "not one rank on each guest in both runs"; exit 1; }
without=$(results plain.log) with=$(results preload.log)
[ "$(echo "$without" | grep -c ', 0 payloads wrong')" = 3 ] ||
	{ echo "without the preload: not 3 verified results"; exit 1; }
[ "$with" = "$without" ] || { echo "results differ:"; echo "$without"; echo "---"; echo "$with"; exit 1; }
n=$(grep -Ec 'gdrcache-preload\[[0-9]+\] stats: .*passthrough_host [1-9]' preload.log)
[ "$n" = 2 ] || { echo "the preload was loaded with registrations in $n rank(s), not 2"; exit 1; }
# (Open MPI's rsh launcher may warn that setpgid of its ssh child failed: a harmless race.)
if cat plain.log preload.log | grep -v 'plm:rsh: Warning: setpgid' | grep -Eiq 'error|warn'; then
	echo "an error or warning line"; exit 1
fi
# 8 B, 64 KiB and 1 MiB messages, $iters (1 MiB: $iters / 10 + 1) each way at the least.
echo "without the preload: $got bytes received on $GDR_VM_NETDEV"
[ $got -ge $(((iters * 65536) + (iters / 10 + 1) * 1048576)) ] ||
	{ echo "the MPI traffic did not cross the link"; exit 1; }
echo "mpirun (hostfile, 2 guests) vm_mpi_pingpong: the same 3 verified results without and with the preload"
