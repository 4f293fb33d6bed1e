#!/bin/sh
# SPDX-License-Identifier: MIT
# Open MPI unchanged under LD_PRELOAD=libgdrcache-preload.so (issue 12 item 3): Debian's Open MPI
# 4.1.4, `mpirun -np 2` with both ranks in the guest, pml ucx over rxe0 (Debian's default config
# turns pml ucx off; --mca pml ucx turns it on, UCX_TLS=rc,self keeps it on RDMA), running
# vm_mpi_pingpong (latency and bandwidth, every payload checked) without and with the preload in
# both ranks (-x LD_PRELOAD). Host memory: the preload passes it through. Same result lines (sizes,
# round trips, 0 payloads wrong), no error or warning, and the preload loaded in both ranks.
# vm-timeout: 300
PRELOAD=/usr/lib/x86_64-linux-gnu/libgdrcache-preload.so
[ -f "$PRELOAD" ] || { echo "libgdrcache-preload.so not built"; exit 77; }
command -v mpirun.openmpi >/dev/null || { echo "Open MPI (openmpi-bin) not in the guest"; exit 77; }
command -v vm_mpi_pingpong >/dev/null || { echo "vm_mpi_pingpong not built (libopenmpi-dev)"; exit 77; }
hostname gdrvm
grep -q gdrvm /etc/hosts 2>/dev/null || echo "127.0.0.1 localhost gdrvm" >>/etc/hosts
export UCX_NET_DEVICES=$GDR_VM_RXE_DEV:1 UCX_TLS=rc,self UCX_IB_GID_INDEX=0
export UCX_WARN_UNUSED_ENV_VARS=n OMPI_MCA_pml=ucx OMPI_MCA_btl=self OMPI_MCA_osc=^ucx,pt2pt
export OMPI_MCA_plm_rsh_agent=false
mpi() {
	mpirun.openmpi -np 2 --allow-run-as-root --oversubscribe --bind-to none \
		-x UCX_NET_DEVICES -x UCX_TLS -x UCX_IB_GID_INDEX -x UCX_WARN_UNUSED_ENV_VARS "$@"
}
results() { grep '^vm_mpi_pingpong: ' "$1" | sed 's/;.*//'; }

mpi vm_mpi_pingpong 200 >plain.log 2>&1
rc=$?
cat plain.log
[ $rc -eq 0 ] || { echo "without the preload: exit $rc"; exit 1; }
LD_PRELOAD=$PRELOAD GDRCACHE_STATS=1 mpi -x LD_PRELOAD -x GDRCACHE_STATS vm_mpi_pingpong 200 \
	>preload.log 2>&1
rc=$?
cat preload.log
[ $rc -eq 0 ] || { echo "with the preload: exit $rc"; exit 1; }
without=$(results plain.log) with=$(results preload.log)
[ -n "$without" ] && [ "$(echo "$without" | grep -c ', 0 payloads wrong')" = 3 ] ||
	{ echo "without the preload: not 3 verified results"; exit 1; }
[ "$with" = "$without" ] || { echo "results differ:"; echo "$without"; echo "---"; echo "$with"; exit 1; }
n=$(grep -Ec 'gdrcache-preload\[[0-9]+\] stats: .*passthrough_host [1-9]' preload.log)
[ "$n" = 2 ] || { echo "the preload was loaded with registrations in $n rank(s), not 2"; exit 1; }
if grep -Eiq 'error|warn' plain.log preload.log; then echo "an error or warning line"; exit 1; fi
echo "mpirun -np 2 vm_mpi_pingpong: the same 3 verified results without and with the preload"
