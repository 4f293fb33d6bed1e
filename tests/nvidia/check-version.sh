#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# One version number (issue 14, module side): VERSION (the single source) must equal kmod/dkms.conf's
# PACKAGE_VERSION and the MODULE_VERSION of a gdrcache.ko built from the tree; and a DKMS-style
# source tree without VERSION must refuse to build (Kbuild reads ../VERSION), not build unversioned.
# Builds in build/version-check (a copy). Exit 0 pass, 1 fail, 77 skip (no kernel headers).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PATH=$PATH:/usr/sbin:/sbin
say() { echo "[version] $*"; }
V=$(tr -d '[:space:]' <"$ROOT/VERSION" 2>/dev/null)
[[ $V =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { say "FAIL: VERSION is '${V}', not X.Y.Z"; exit 1; }
KDIR=${KDIR:-}
if [[ -z $KDIR ]]; then
	HPKG=$(apt-cache depends linux-headers-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-headers-[0-9].*-amd64\)$/\1/p' | head -1)
	[[ -n $HPKG && -d /usr/src/$HPKG ]] && KDIR=/usr/src/$HPKG || KDIR=/lib/modules/$(uname -r)/build
fi
[[ -d $KDIR ]] || { say "SKIP: no kernel headers ($KDIR)"; exit 77; }
fails=0
D=$(sed -n 's/^PACKAGE_VERSION="\(.*\)"$/\1/p' "$ROOT/kmod/dkms.conf")
if [[ $D == "$V" ]]; then say "dkms.conf PACKAGE_VERSION $D = VERSION"; else say "FAIL: dkms.conf PACKAGE_VERSION '$D', VERSION '$V'"; fails=$((fails + 1)); fi

B=$ROOT/build/version-check
rm -rf "$B"; mkdir -p "$B/tree"
cp -r "$ROOT/kmod" "$ROOT/include" "$ROOT/VERSION" "$B/tree/"
(cd "$B/tree/kmod" && rm -f ./*.ko ./*.o ./*.mod* Module.symvers modules.order nvidia-ko.symvers)
if make -C "$B/tree/kmod" KDIR="$KDIR" KBUILD_EXTRA_SYMBOLS= NVIDIA_KO= KBUILD_MODPOST_WARN=1 modules >"$B/build.log" 2>&1; then
	M=$(modinfo -F version "$B/tree/kmod/gdrcache.ko")
	if [[ $M == "$V" ]]; then say "gdrcache.ko modinfo version $M = VERSION"; else say "FAIL: gdrcache.ko version '$M', VERSION '$V'"; fails=$((fails + 1)); fi
	S=$(modinfo -F softdep "$B/tree/kmod/gdrcache.ko")
	[[ $S == "pre: nvidia" ]] || { say "FAIL: softdep '$S', want 'pre: nvidia'"; fails=$((fails + 1)); }
else
	tail -20 "$B/build.log"; say "FAIL: gdrcache.ko does not build"; fails=$((fails + 1))
fi
# The same tree without VERSION: the build must stop and say why.
rm -f "$B/tree/VERSION"
(cd "$B/tree/kmod" && rm -f ./*.ko ./*.o ./*.mod*)
if make -C "$B/tree/kmod" KDIR="$KDIR" KBUILD_EXTRA_SYMBOLS= NVIDIA_KO= KBUILD_MODPOST_WARN=1 modules >"$B/noversion.log" 2>&1; then
	say "FAIL: a tree without VERSION built"; fails=$((fails + 1))
elif grep -q 'VERSION is missing' "$B/noversion.log"; then
	say "a tree without VERSION refuses to build: $(grep -o '[^ ]*VERSION is missing.*' "$B/noversion.log" | head -1)"
else
	tail -5 "$B/noversion.log"; say "FAIL: a tree without VERSION failed for another reason"; fails=$((fails + 1))
fi
((fails)) && { say "FAILED: $fails"; exit 1; }
say PASS
