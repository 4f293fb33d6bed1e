#!/bin/sh
# SPDX-License-Identifier: GPL-2.0 OR MIT
#
# check-no-gpl-symbols.sh KO KDIR
# Fails if the module KO uses a symbol that the kernel in KDIR exports only to
# GPL modules (EXPORT_SYMBOL_GPL in KDIR/Module.symvers): such a module could
# not be loaded beside NVIDIA's proprietary driver.
set -eu

if [ $# -ne 2 ]; then
	echo "usage: $0 KO KDIR" >&2
	exit 2
fi
ko=$1
symvers=$2/Module.symvers

if [ ! -r "$ko" ]; then
	echo "$0: cannot read $ko" >&2
	exit 2
fi
if [ ! -r "$symvers" ]; then
	echo "$0: cannot read $symvers" >&2
	exit 2
fi

undef=$(nm -u "$ko" | awk '{ print $2 }' | sort -u)
if [ -z "$undef" ]; then
	echo "$0: $ko has no undefined symbols?" >&2
	exit 2
fi

gpl=$(echo "$undef" | awk 'NR == FNR { want[$1] = 1; next }
	($2 in want) && $4 ~ /_GPL$/ { print $2 }' - "$symvers")

if [ -n "$gpl" ]; then
	echo "$ko uses GPL-only symbols:" >&2
	echo "$gpl" | sed 's/^/  /' >&2
	exit 1
fi
echo "$ko: $(echo "$undef" | wc -l) undefined symbols, none GPL-only"
