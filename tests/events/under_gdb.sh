#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs a program under gdb as a developer would (gdb -batch -ex run: no address space
# randomisation, every thread traced, signals reported to gdb first) and passes on its exit status.
# Fails if the program stopped on a signal (gdb prints "received signal"), or did not exit.
# Usage: under_gdb.sh PROGRAM ARGS...   Exit: the program's status; 77 without gdb.
command -v gdb >/dev/null 2>&1 || { echo "SKIP: no gdb"; exit 77; }
out=$(timeout 100 gdb -nx -batch -ex 'set startup-with-shell off' -ex run \
	-ex 'printf "EXITCODE %d\n", $_exitcode' --args "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
[ $rc -eq 124 ] && { echo "FAIL: gdb or the program did not finish within 100 s"; exit 1; }
if printf '%s\n' "$out" | grep -q "received signal"; then
	echo "FAIL: the program stopped on a signal under gdb"
	exit 1
fi
code=$(printf '%s\n' "$out" | sed -n 's/^EXITCODE \([0-9]*\)$/\1/p' | tail -1)
[ -n "$code" ] || { echo "FAIL: the program did not exit under gdb"; exit 1; }
exit "$code"
