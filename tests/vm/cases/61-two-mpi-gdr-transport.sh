#!/bin/sh
# SPDX-License-Identifier: MIT
# examples/mpi_gdr_transport across two guests (tests/vm/run --two, issue 32): Open MPI's mpirun
# with a hostfile starts rank 0 here and rank 1 on node 2 through its rsh launch agent (vm-ssh:
# dropbear); each rank RDMA-writes fake-driver "GPU" buffers (pinned through that guest's
# gdrcache.ko and simulated NVIDIA provider) into the other's over rxe0 and the link; MPI (ob1 over
# TCP on the link) carries keys and barriers. As case 52: every payload verified, buffers freed and
# reallocated every 25 messages at the same address, 0 stale, mode events and hits in both ranks.
# Then without the cache (-u: ibv_reg_mr/ibv_dereg_mr around every message): the same outcome.
# vm-two: yes
# vm-timeout: 300
[ "$GDR_VM_NODE" = 1 ] || { echo "not node 1 of tests/vm/run --two"; exit 77; }
command -v mpirun.openmpi >/dev/null || { echo "Open MPI (openmpi-bin) not in the guest"; exit 77; }
command -v mpi_gdr_transport >/dev/null || { echo "mpi_gdr_transport not built (libopenmpi-dev)"; exit 77; }
export LD_LIBRARY_PATH="$GDR_VM_FAKE_CUDA_DIR" FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim
export GDRCACHE_VALIDATE=events GDRCACHE_STATS=1
# One rank on each guest (hostfile: gdrvm1 slots=1, gdrvm2 slots=1).
# mpirun ends within 200 s or is ended (timeout: exit 124).
mpi() {
	timeout -k 10 200 mpirun.openmpi --allow-run-as-root -np 2 --hostfile "$GDR_VM_HOSTFILE" --map-by node \
		--bind-to none --display-map --mca plm_rsh_agent /tests/bin/vm-ssh --mca plm_rsh_no_tree_spawn 1 \
		--mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 \
		--mca pml ob1 --mca btl self,tcp \
		-x PATH -x LD_LIBRARY_PATH -x FAKE_CUDA_P2P_SIM -x GDRCACHE_VALIDATE -x GDRCACHE_STATS "$@"
}
rx() { cat "/sys/class/net/$GDR_VM_NETDEV/statistics/rx_bytes"; }
messages=${GT_MESSAGES:-100}
size=16384
fail=0
# check LOG CACHE: the assertions of case 52 (for the cached run: CACHE "mode events"; else "off"),
# and both ranks placed one on each guest.
check() {
	n=$(grep -Ec 'Data for node: gdrvm[12][[:space:]].*Num procs: 1' "$1")
	[ "$n" = 2 ] || { echo "$1: not one rank on each guest ($n)"; return 1; }
	n=$(grep -Ec "^mpi_gdr_transport: rank [01]: [1-9][0-9]* writes, 0 payloads wrong, [1-9][0-9]* registrations, 0 stale; cache: $2" "$1")
	[ "$n" = 2 ] || { echo "$1: not 2 ranks with every payload right, 0 stale, cache: $2 ($n)"; return 1; }
	grep -Eq '^mpi_gdr_transport: 2 ranks, .* 0 payloads wrong, 0 stale registrations of [1-9][0-9]*, [1-9][0-9]* reallocations at the same address' "$1" ||
		{ echo "$1: no summary with 0 wrong, 0 stale and reallocations at the same address"; return 1; }
	if [ "$2" = "mode events" ]; then
		grep -Eq '^mpi_gdr_transport: rank [01]: .* [1-9][0-9]* hits' "$1" || { echo "$1: no cache hits"; return 1; }
		n=$(grep -Ec 'gdrcache\[[0-9]+\] stats .*validate events\): .* events [1-9][0-9]* events_lost 0' "$1")
		[ "$n" = 2 ] || { echo "$1: GDRCACHE_STATS: not 2 caches in mode events with free events applied ($n)"; return 1; }
	fi
	# (Open MPI's rsh launcher may warn that setpgid of its ssh child failed: a harmless race.)
	if grep -v 'plm:rsh: Warning: setpgid' "$1" | grep -Eiq 'error|warn'; then
		echo "$1: an error or warning line"; return 1
	fi
	return 0
}
# The outcome compared: the summary up to its rate.
outcome() { sed -n 's/^\(mpi_gdr_transport: 2 ranks, .*\); .*/\1/p' "$1"; }

for run in cached uncached; do
	if [ $run = cached ]; then flag="" mode="mode events"; else flag=-u mode=off; fi
	rx0=$(rx)
	# shellcheck disable=SC2086 # $flag is empty or -u
	mpi /tests/bin/mpi_gdr_transport -d "$GDR_VM_RXE_DEV" -g "$GDR_VM_GID" -n "$messages" \
		-s $size -r 25 $flag >$run.log 2>&1
	rc=$?
	cat $run.log
	[ $rc = 0 ] || { echo "$run: mpirun exit $rc"; fail=1; continue; }
	check $run.log "$mode" || fail=1
	got=$(($(rx) - rx0))
	echo "$run: $got bytes received on $GDR_VM_NETDEV"
	[ $got -ge $((messages * size)) ] || { echo "$run: the writes into this rank did not cross the link"; fail=1; }
done
[ $fail = 0 ] || exit 1
[ "$(outcome cached.log)" = "$(outcome uncached.log)" ] ||
	{ echo "outcomes differ:"; outcome cached.log; outcome uncached.log; exit 1; }
echo "the same outcome with and without the cache: $(outcome cached.log)"
