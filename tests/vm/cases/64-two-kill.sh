#!/bin/sh
# SPDX-License-Identifier: MIT
# A rank SIGKILLed on node 2 in the middle of RDMA traffic (tests/vm/run --two, issue 32):
#   1. examples/mpi_gdr_transport under mpirun (hostfile, one rank on each guest, pinned
#      fake-driver "GPU" buffers, the cache in mode events), rank 1 killed on node 2 while it holds
#      pins and writes: mpirun must end by itself within 90 s with an error (rank 0's verbs error
#      completion, transport retries exceeded; or rank 0's MPI error, its peer disconnected; or,
#      had rank 0 been ended first, Open MPI's notice of the killed rank), and
#      gdrcache.ko must hold 0 pins (and 0 orphans) on node 2 within 30 s, and on this guest once
#      the job is gone.
#   2. The job restarted on the same guests: every payload right, 0 stale, mode events, as case 61.
# Not ibv_rc_pingpong or perftest: they set retry_cnt 7, which soft-RoCE takes as "retry for ever"
# (rxe_comp.c), so their writer never learns that its peer died (mpi_gdr_transport uses 6).
# vm-two: yes
# vm-timeout: 420
# shellcheck disable=SC2016,SC2317 # commands for node 2's shell; functions called through until_ok
[ "$GDR_VM_NODE" = 1 ] || { echo "not node 1 of tests/vm/run --two"; exit 77; }
if [ ! -c /dev/gdrcache ] || [ ! -c /dev/nvp2p_sim ]; then
	echo "gdrcache.ko or nvp2p_sim.ko not loaded"
	exit 77
fi
command -v mpirun.openmpi >/dev/null || { echo "Open MPI (openmpi-bin) not in the guest"; exit 77; }
command -v mpi_gdr_transport >/dev/null || { echo "mpi_gdr_transport not built (libopenmpi-dev)"; exit 77; }
peer() { timeout 30 vm-ssh "$GDR_VM_PEER" "$@"; }
rx() { cat "/sys/class/net/$GDR_VM_NETDEV/statistics/rx_bytes"; }
param() { cat "/sys/module/gdrcache/parameters/$1"; }
peer_param() { peer cat "/sys/module/gdrcache/parameters/$1"; }
uptime_s() { read -r t _ </proc/uptime; echo "${t%.*}"; }
# until SECONDS COMMAND...: run COMMAND every 0.2 s until it succeeds; 1 if SECONDS pass first.
until_ok() {
	deadline=$(($(uptime_s) + $1))
	shift
	until "$@"; do
		[ "$(uptime_s)" -lt $deadline ] || return 1
		sleep 0.2
	done
}
# flowing BYTES: this guest received BYTES more than at $rx0 (the traffic is under way).
flowing() { [ $(($(rx) - rx0)) -ge "$1" ]; }
fail=0

echo "=== 1. mpi_gdr_transport: rank 1 killed on node 2"
export LD_LIBRARY_PATH="$GDR_VM_FAKE_CUDA_DIR" FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim
export GDRCACHE_VALIDATE=events GDRCACHE_STATS=1
mpi() {
	timeout -k 10 "$1" mpirun.openmpi --allow-run-as-root -np 2 --hostfile "$GDR_VM_HOSTFILE" \
		--map-by node --bind-to none --mca plm_rsh_agent /tests/bin/vm-ssh --mca plm_rsh_no_tree_spawn 1 \
		--mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 \
		--mca pml ob1 --mca btl self,tcp \
		-x PATH -x LD_LIBRARY_PATH -x FAKE_CUDA_P2P_SIM -x GDRCACHE_VALIDATE -x GDRCACHE_STATS \
		/tests/bin/mpi_gdr_transport -d "$GDR_VM_RXE_DEV" -g "$GDR_VM_GID" -n "$2" -s 16384 -r 25
}
peer_pins() { [ "$(peer_param pins)" -gt 0 ] 2>/dev/null; }
rx0=$(rx)
mpi 300 1000000 >kill.log 2>&1 &
job=$!
# Under way: rank 1 holds pins on node 2 and 20 of its writes (16 KiB each) arrived here.
if ! until_ok 120 flowing 327680 || ! peer_pins; then
	cat kill.log; echo "the job's traffic did not start within 120 s"; exit 1
fi
held=$(peer_param pins)
peer 'kill -9 $(pidof mpi_gdr_transport)' || { echo "could not kill rank 1 on node 2"; exit 1; }
echo "killed rank 1 on node 2 holding $held pins, after $(($(rx) - rx0)) bytes"
vm-wait-exit "$job" 90 "mpirun after rank 1 was killed"
case $? in
0) wait "$job"; rc=$? ;;
1) wait "$job"; rc=124 ;;
*) rc=124 ;;
esac
cat kill.log
if [ $rc = 124 ]; then
	echo "mpirun did not end within 90 s of rank 1's death"; fail=1
elif [ $rc = 0 ]; then
	echo "mpirun exited 0 though rank 1 was killed"; fail=1
elif grep -q 'gdr_transport: completion: ' kill.log; then
	echo "rank 0 got a verbs error: $(grep -m 1 'gdr_transport: completion: ' kill.log); mpirun exit $rc"
elif grep -q 'An MPI communication peer process has unexpectedly disconnected' kill.log &&
	grep -Eq '^ *Local host: +gdrvm1' kill.log; then
	echo "rank 0 (gdrvm1) got an MPI error: its peer unexpectedly disconnected; mpirun exit $rc"
elif grep -Eq 'rank 1 .*on node gdrvm2 exited on signal 9' kill.log; then
	echo "mpirun reported the killed rank: $(grep -m 1 -E 'exited on signal 9' kill.log | sed 's/^ *//'); exit $rc"
else
	echo "mpirun exited $rc without naming the killed rank or a verbs error"; fail=1
fi
no_pins() { [ "$(peer_param pins)" = 0 ] && [ "$(peer_param orphans)" = 0 ]; }
if until_ok 30 no_pins; then
	echo "node 2: gdrcache.ko holds 0 pins, 0 orphans after the kill (it held $held)"
else
	echo "node 2: gdrcache.ko still holds $(peer_param pins) pins, $(peer_param orphans) orphans 30 s after the kill"
	fail=1
fi
[ "$(param pins)" = 0 ] || { echo "node 1: gdrcache.ko holds $(param pins) pins after the job"; fail=1; }

echo "=== 2. the job again on the same guests"
mpi 200 50 >again.log 2>&1
rc=$?
cat again.log
[ $rc = 0 ] || { echo "the restarted job: mpirun exit $rc"; exit 1; }
n=$(grep -Ec '^mpi_gdr_transport: rank [01]: [1-9][0-9]* writes, 0 payloads wrong, [1-9][0-9]* registrations, 0 stale; cache: mode events' again.log)
[ "$n" = 2 ] || { echo "the restarted job: not 2 ranks with every payload right, 0 stale, mode events ($n)"; fail=1; }
grep -Eq '^mpi_gdr_transport: 2 ranks, .* 0 payloads wrong, 0 stale registrations' again.log ||
	{ echo "the restarted job: no summary with 0 wrong, 0 stale"; fail=1; }
if grep -Eiq 'error|warn' again.log; then echo "the restarted job: an error or warning line"; fail=1; fi
until_ok 30 no_pins || { echo "node 2: pins left after the restarted job"; fail=1; }
exit $fail
