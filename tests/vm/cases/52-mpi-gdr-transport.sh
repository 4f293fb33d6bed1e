#!/bin/sh
# SPDX-License-Identifier: MIT
# A transport under mpirun (issue 12 item 4): examples/mpi_gdr_transport, `mpirun -np 2` in the
# guest; its data path is libgdr_transport.so, which registers "GPU" buffers of the fake CUDA driver
# (declared to the simulated NVIDIA provider, pinned through gdrcache.ko) with gdr_reg around every
# message and RDMA-writes them over rxe0; MPI (ob1 over shared memory) only carries keys and
# barriers. Every payload verified; both buffers freed and reallocated every 50 messages (at the
# same address); every registration's buffer id checked against the driver's: 0 stale. Mode events
# is asked for (GDRCACHE_VALIDATE=events: the cache refuses to start where the free interception is
# not proven) and shown by GDRCACHE_STATS=1 in both ranks.
# vm-timeout: 240
command -v mpirun.openmpi >/dev/null || { echo "Open MPI (openmpi-bin) not in the guest"; exit 77; }
command -v mpi_gdr_transport >/dev/null || { echo "mpi_gdr_transport not built (libopenmpi-dev)"; exit 77; }
hostname gdrvm
grep -q gdrvm /etc/hosts 2>/dev/null || echo "127.0.0.1 localhost gdrvm" >>/etc/hosts
export LD_LIBRARY_PATH=$GDR_VM_FAKE_CUDA_DIR FAKE_CUDA_P2P_SIM=/dev/nvp2p_sim
export GDRCACHE_VALIDATE=events GDRCACHE_STATS=1 OMPI_MCA_plm_rsh_agent=false
mpirun.openmpi -np 2 --allow-run-as-root --oversubscribe --bind-to none \
	--mca pml ob1 --mca btl self,vader \
	-x LD_LIBRARY_PATH -x FAKE_CUDA_P2P_SIM -x GDRCACHE_VALIDATE -x GDRCACHE_STATS \
	mpi_gdr_transport -d "$GDR_VM_RXE_DEV" -g "$GDR_VM_GID" -n "${GT_MESSAGES:-400}" -s 65536 -r 50 \
	>run.log 2>&1
rc=$?
cat run.log
[ $rc -eq 0 ] || { echo "mpirun: exit $rc"; exit 1; }
fail=0
n=$(grep -Ec '^mpi_gdr_transport: rank [0-9]+: [1-9][0-9]* writes, 0 payloads wrong, [1-9][0-9]* registrations, 0 stale; cache: mode events' run.log)
[ "$n" = 2 ] || { echo "not 2 ranks with every payload right, 0 stale, mode events ($n)"; fail=1; }
grep -Eq '^mpi_gdr_transport: 2 ranks, .* 0 payloads wrong, 0 stale registrations of [1-9][0-9]*, [1-9][0-9]* reallocations at the same address' run.log ||
	{ echo "no summary with 0 wrong, 0 stale and reallocations at the same address"; fail=1; }
grep -Eq '^mpi_gdr_transport: rank 0: .* [1-9][0-9]* hits' run.log || { echo "no cache hits"; fail=1; }
n=$(grep -Ec 'gdrcache\[[0-9]+\] stats .*validate events\): .* events [1-9][0-9]* events_lost 0' run.log)
[ "$n" = 2 ] || { echo "GDRCACHE_STATS: not 2 caches in mode events with free events applied ($n)"; fail=1; }
if grep -Eiq 'error|warn' run.log; then echo "an error or warning line"; fail=1; fi
[ $fail = 0 ] && grep '^mpi_gdr_transport: 2 ranks' run.log

# The job's records for gdrcache_report(1): a shorter run again, each rank writing JSON records to
# a file of its own (GDRCACHE_STATS=file:DIR/%p.json); two files, each with cache records (their
# "stale" counts entries dropped for reallocations: not stale registrations, which the run above
# checks). gdrcache_report (Python) then reads them where the guest has python3 and the
# tool; this guest has neither (tests/vm/README.md), so the records are printed instead, for
# `gdrcache_report` on the host.
mkdir stats
GDRCACHE_STATS=file:$PWD/stats/%p.json GDRCACHE_STATS_FORMAT=json \
	mpirun.openmpi -np 2 --allow-run-as-root --oversubscribe --bind-to none \
	--mca pml ob1 --mca btl self,vader \
	-x LD_LIBRARY_PATH -x FAKE_CUDA_P2P_SIM -x GDRCACHE_VALIDATE -x GDRCACHE_STATS \
	-x GDRCACHE_STATS_FORMAT \
	mpi_gdr_transport -d "$GDR_VM_RXE_DEV" -g "$GDR_VM_GID" -n "${GT_REPORT_MESSAGES:-100}" \
	-s 65536 -r 50 >records.log 2>&1
rc=$?
[ $rc -eq 0 ] || { cat records.log; echo "mpirun with GDRCACHE_STATS=file: exit $rc"; fail=1; }
if grep -Eiq 'error|warn' records.log; then cat records.log; echo "an error or warning line (records)"; fail=1; fi
n=0
for f in stats/*.json; do [ -f "$f" ] && n=$((n + 1)); done
[ "$n" = 2 ] || { ls -l stats; echo "GDRCACHE_STATS=file:: not 2 record files ($n)"; fail=1; }
for f in stats/*.json; do
	[ -f "$f" ] || continue
	grep -q '"source": "cache"' "$f" || { echo "$f: no cache record"; fail=1; }
done
echo "--- records (gdrcache_report DIR reads them) ---"
cat stats/*.json
echo "--- end of records ---"
if command -v python3 >/dev/null && command -v gdrcache_report >/dev/null; then
	gdrcache_report -v stats >report.txt 2>&1
	rc=$?
	cat report.txt
	[ $rc -eq 0 ] || { echo "gdrcache_report: exit $rc"; fail=1; }
	head -n 1 report.txt | grep -Eq '^gdrcache_report: 2 (ranks|processes without a rank)[ ,]' ||
		{ echo "gdrcache_report: not both ranks"; fail=1; }
	grep -Eq '^total: hit rate .* revoked 0,' report.txt ||
		{ echo "gdrcache_report: not 0 revoked in total"; fail=1; }
else
	echo "gdrcache_report not run: no python3 or no gdrcache_report in the guest"
fi
exit $fail
