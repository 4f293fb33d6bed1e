#!/bin/sh
# SPDX-License-Identifier: MIT
# A short perftest ib_write_bw run over rxe0 (RDMA WRITE, RC), server and client on the one device.
# Run once more where perftest's own clock check failed and it printed a zero row ("Correlation
# coefficient r^2 ... < 0.9": its cycle-counter calibration, which a loaded TCG host upsets).
# vm-timeout: 180
# The result row: bytes, iterations, peak and average BW (MB/s), msg rate; the average must be > 0.
row() { awk '$1 == 65536 && $2 == 200 { ok = ($4 + 0 > 0) } END { exit !ok }' client.log; }
for try in 1 2; do
	vm-server-client 18516 ib_write_bw -d "$GDR_VM_RXE_DEV" -x "$GDR_VM_GID" -p 18516 -s 65536 \
		-n 200 -F || exit 1
	row && exit 0
	grep -q 'Correlation coefficient' client.log || exit 1
	echo "perftest's clock calibration failed (try $try): again"
done
exit 1
