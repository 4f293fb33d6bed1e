#!/bin/sh
# SPDX-License-Identifier: MIT
# The emulator cmake/aarch64-linux-gnu.cmake gives ctest: qemu-run.sh QEMU PREFIX PROGRAM [ARGS...]
# runs PROGRAM under qemu-user, its loader and libraries from PREFIX (-L). A test's LD_PRELOAD is
# meant for PROGRAM, not for qemu (a host program, whose own loader would refuse the foreign library
# with an error on stderr): it is handed to the guest alone, through QEMU_SET_ENV.
qemu=$1 prefix=$2
shift 2
if [ -n "${LD_PRELOAD+x}" ]; then
	QEMU_SET_ENV="LD_PRELOAD=$LD_PRELOAD${QEMU_SET_ENV:+,$QEMU_SET_ENV}"
	export QEMU_SET_ENV
	unset LD_PRELOAD
fi
exec "$qemu" -L "$prefix" "$@"
