#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR MIT
# nvidia-symvers.sh NVIDIA_KO: print Module.symvers lines for the nvidia_p2p_* symbols that an
# installed NVIDIA module exports, with their symbol versions (CRCs) read from its __kcrctab.
# What modpost needs (KBUILD_EXTRA_SYMBOLS) when NVIDIA's build tree, and so its Module.symvers,
# is gone, as it is after DKMS built NVIDIA's driver. NVIDIA_KO may be .ko, .ko.xz, .ko.zst or .ko.gz.
# Prints nothing (exit 1) if the module exports no versioned nvidia_p2p_* symbol.
set -eu
ko=${1:?usage: nvidia-symvers.sh NVIDIA_KO}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
case $ko in
*.xz) xz -dc "$ko" >"$tmp/m.ko" ;;
*.zst) zstd -qdc "$ko" >"$tmp/m.ko" ;;
*.gz) gzip -dc "$ko" >"$tmp/m.ko" ;;
*) cp "$ko" "$tmp/m.ko" ;;
esac
objcopy -O binary --only-section=__kcrctab "$tmp/m.ko" "$tmp/crc" 2>/dev/null || exit 1
# __crc_SYM's value is the offset of SYM's 32-bit CRC in __kcrctab (little-endian on x86 and arm64).
nm "$tmp/m.ko" | awk '$3 ~ /^__crc_nvidia_p2p_/ { print $1, substr($3, 7) }' | {
	n=0
	while read -r off sym; do
		crc=$(od -An -tx4 -j $((0x$off)) -N4 "$tmp/crc" | tr -d ' ')
		[ -n "$crc" ] || continue
		printf '0x%s\t%s\tnvidia\tEXPORT_SYMBOL\t\n' "$crc" "$sym"
		n=$((n + 1))
	done
	[ "$n" -gt 0 ]
}
