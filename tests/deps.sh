#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Install the Debian packages the build and the tests need (root; skipped when all are present).
# tests/vm/run installs what the VM needs itself (QEMU, Debian's kernel, busybox, rdma tools).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libibverbs-dev uthash-dev libcmocka-dev ibverbs-providers
      rdma-core ibverbs-utils perftest kmod cpio)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "[deps] installing: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
