#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the Debian packages the build and the tests need (root; skipped when all are present).
# --arm64: also the aarch64 cross build's (tests/run's aarch64 stage): Debian's cross compiler,
# qemu-user (qemu-aarch64, run explicitly: not qemu-user-binfmt) and the arm64 multiarch libraries,
# for which dpkg gets the foreign architecture arm64.
# tests/vm/run installs what the VM needs itself (QEMU, Debian's kernel, busybox, rdma tools).
set -euo pipefail
# shellcheck source=tests/apt.sh
. "$(dirname "${BASH_SOURCE[0]}")/apt.sh" # gdr_apt: waits for the apt/dpkg locks, one retry
pkgs=(build-essential cmake pkg-config libibverbs-dev uthash-dev libcmocka-dev ibverbs-providers
      rdma-core ibverbs-utils perftest kmod cpio
      python3 man-db groff-base   # the manual pages: docs/man/mkman.py, tests/packaging/check_man.sh
      clang-format-14             # tests/style/check_format.sh
      gdb)                        # tests/events/under_gdb.sh
arm64=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libibverbs-dev:arm64
       libcmocka-dev:arm64)
case ${1-} in
--arm64) pkgs+=("${arm64[@]}") ;;
"") ;;
*) echo "usage: tests/deps.sh [--arm64]"; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "[deps] installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	if [[ "${missing[*]}" == *:arm64* ]] &&
		! dpkg --print-foreign-architectures | grep -qx arm64; then
		dpkg --add-architecture arm64
	fi
	gdr_apt update -qq
	gdr_apt install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
