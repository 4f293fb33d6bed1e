#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gdrcache.ko through DKMS against NVIDIA's real driver (issue 15 items 2 and 3). Run after
# check-abi.sh, whose download cache (build/nvidia/debs) it uses. As root:
#   1. builds NVIDIA's proprietary nvidia.ko (Debian's nvidia-kernel-source: the kernel interface
#      compiled here, NVIDIA's prebuilt nv-kernel.o_binary linked in) for Debian's 6.1 headers,
#      cached in build/nvidia/ko-<version>-<headers>/;
#   2. installs dkms (apt) and installs that nvidia.ko where Debian's DKMS package puts NVIDIA's
#      driver (/lib/modules/KVER/updates/dkms/nvidia-current.ko, then depmod);
#   3. builds gdrcache through DKMS from a source tree laid out as dkms.conf says (kmod/, include/,
#      VERSION), in private DKMS trees (--dkmstree/--sourcetree/--installtree under build/dkms), and
#      requires the built module to carry NVIDIA's symbol versions for every nvidia_p2p_* it
#      imports (read from the installed nvidia.ko and from check-abi's nv-p2p.o) and VERSION as
#      its version; first, as a control, the same DKMS build with no NVIDIA module installed must
#      lack those versions (modpost warns);
#   4. leaves nvidia.ko and the DKMS-built module as tests/kmod/nvidia-real/{nvidia,gdrcache-dkms}.ko
#      for the VM case 28-nvidia-real-load.sh, and removes what it installed in /lib/modules.
# Differs from a real system: NVIDIA's module is built by make here, not by DKMS from Debian's
# nvidia-kernel-dkms (that package's DKMS build of all five modules would take far longer), and
# only nvidia.ko is built. Exit 0 pass, 1 fail, 77 skip (not root, not Debian, no cached NVIDIA
# source, dkms not installable). Env: GDR_NVIDIA_KO_BUILD=0 skips (77).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/apt.sh
. "$ROOT/tests/apt.sh" # gdr_apt: waits for the apt/dpkg locks, one retry
PATH=$PATH:/usr/sbin:/sbin
W=$ROOT/build/nvidia
T0=$SECONDS
say() { echo "[nvidia-dkms] $*"; }
skip() { say "SKIP: $*"; exit 77; }
die() { say "FAIL: $*"; exit 1; }
[[ ${GDR_NVIDIA_KO_BUILD:-1} != 0 ]] || skip "GDR_NVIDIA_KO_BUILD=0"
((EUID == 0)) || skip "needs root (dkms, /lib/modules)"
[[ -r /etc/os-release ]] && . /etc/os-release
[[ ${ID-} == debian ]] || skip "not Debian"
PDEB=$(ls "$W"/debs/nvidia-kernel-source_*.deb 2>/dev/null | tail -1)
[[ -n $PDEB ]] || skip "no nvidia-kernel-source .deb in build/nvidia/debs (check-abi.sh fetches it)"
SYMVERS=$(ls "$W"/nvidia-*-linux-headers-*.symvers 2>/dev/null | tail -1)
[[ -n $SYMVERS ]] || skip "no nv-p2p.o symbol versions from check-abi.sh"
HPKG=$(apt-cache depends linux-headers-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-headers-[0-9].*-amd64\)$/\1/p' | head -1)
KDIR=/usr/src/$HPKG KVER=${HPKG#linux-headers-}
[[ -d $KDIR ]] || skip "no $KDIR"
V=$(tr -d '[:space:]' <"$ROOT/VERSION")
PVER=$(dpkg-deb -f "$PDEB" Version)

# ---- 1. NVIDIA's nvidia.ko (cached) -----------------------------------------------------------
KO=$W/ko-$PVER-$HPKG
if [[ ! -s $KO/nvidia.ko ]]; then
	t=$SECONDS
	rm -rf "$KO.src"; mkdir -p "$KO.src"
	dpkg-deb --fsys-tarfile "$PDEB" | tar -x -C "$KO.src" --wildcards './usr/src/*.tar.xz' &&
		xz -dc "$KO.src"/usr/src/*.tar.xz | tar -x -C "$KO.src" || die "unpacking $PDEB"
	NVB=$(dirname "$(find "$KO.src" -path '*/nvidia/nv-kernel.o_binary' | head -1)")
	NVB=${NVB%/nvidia}
	[[ -f $NVB/Kbuild ]] || die "no nvidia/nv-kernel.o_binary in $PDEB"
	KSRC=$(sed -n 's,^include \(/.*\)/Makefile$,\1,p' "$KDIR/Makefile" | head -1)
	[[ -d $KSRC ]] || KSRC=$KDIR
	if ! make -C "$KDIR" M="$NVB" ARCH=x86_64 NV_KERNEL_SOURCES="$KSRC" NV_KERNEL_OUTPUT="$KDIR" \
		NV_KERNEL_MODULES=nvidia -j"$(nproc)" modules >"$W/nvko.log" 2>&1; then
		tail -30 "$W/nvko.log"; die "NVIDIA's nvidia.ko ($PVER) does not build against $HPKG"
	fi
	mkdir -p "$KO"
	strip --strip-debug -o "$KO/nvidia.ko" "$NVB/nvidia.ko" || die "strip"
	rm -rf "$KO.src"
	say "nvidia.ko $PVER built in $((SECONDS - t)) s"
fi
say "nvidia.ko $PVER: $(modinfo -F version "$KO/nvidia.ko"), $(du -h "$KO/nvidia.ko" | cut -f1)"
"$ROOT/kmod/nvidia-symvers.sh" "$KO/nvidia.ko" >"$KO/nvidia-ko.symvers" || die "no nvidia_p2p_* CRCs in nvidia.ko"

# ---- 2. dkms ----------------------------------------------------------------------------------
if ! command -v dkms >/dev/null; then
	DEBIAN_FRONTEND=noninteractive gdr_apt install -y -qq --no-install-recommends dkms >"$W/dkms-apt.log" 2>&1 ||
		{ tail -5 "$W/dkms-apt.log"; skip "apt-get install dkms failed"; }
fi
say "$(dkms --version 2>&1 | head -1)"

# ---- 3. DKMS builds, private trees -------------------------------------------------------------
D=$ROOT/build/dkms
NVDIR=/lib/modules/$KVER/updates/dkms
cleanup() { rm -f "$NVDIR/nvidia-current.ko"; rmdir -p "$NVDIR" 2>/dev/null; depmod "$KVER" 2>/dev/null; }
trap cleanup EXIT
dkms_build() { # label -> sets BUILT (the .ko) and LOG
	rm -rf "$D"; mkdir -p "$D/tree" "$D/src/gdrcache-$V" "$D/install"
	cp -r "$ROOT/kmod" "$ROOT/include" "$ROOT/VERSION" "$D/src/gdrcache-$V/"
	cp "$ROOT/kmod/dkms.conf" "$D/src/gdrcache-$V/"
	(cd "$D/src/gdrcache-$V/kmod" && rm -f ./*.ko ./*.o ./*.mod* ./.*.cmd Module.symvers modules.order nvidia-ko.symvers)
	local o=(--dkmstree "$D/tree" --sourcetree "$D/src" --installtree "$D/install")
	LOG=$D/$1.log
	{ dkms add "${o[@]}" -m gdrcache -v "$V" &&
	  dkms build "${o[@]}" -m gdrcache -v "$V" -k "$KVER" --kernelsourcedir "$KDIR"; } >"$LOG" 2>&1 || {
		cat "$LOG"; find "$D/tree" -name make.log -exec tail -20 {} +; die "dkms build ($1)"; }
	cp "$(find "$D/tree/gdrcache/$V" -name make.log | head -1)" "$D/$1.make.log" 2>/dev/null
	BUILT=$(find "$D/tree/gdrcache/$V/$KVER" -name 'gdrcache.ko*' | head -1)
	[[ -n $BUILT ]] || die "dkms built no gdrcache.ko ($1)"
	case $BUILT in *.xz) xz -dc "$BUILT" >"$D/$1.ko" ;; *.zst) zstd -qdc "$BUILT" >"$D/$1.ko" ;; *) cp "$BUILT" "$D/$1.ko" ;; esac
	BUILT=$D/$1.ko
}
fails=0
# Control: no NVIDIA module for KVER -> no nvidia_p2p_* versions (what a build before NVIDIA's gives).
cleanup
dkms_build control
n=$(modprobe --dump-modversions "$BUILT" | grep -c nvidia_p2p_)
grep -q 'WARNING: modpost: "nvidia_p2p_' "$D/control.make.log" || grep -q 'nvidia_p2p_.*undefined' "$D/control.make.log"
w=$?
if ((n == 0 && w == 0)); then say "control (no NVIDIA module installed): modpost warns, no nvidia_p2p_* versions: as expected"
else say "FAIL: control build has $n nvidia_p2p_* versions (modpost warning found: $((w == 0)))"; fails=$((fails + 1)); fi

# With NVIDIA's module installed as Debian's DKMS package installs it.
mkdir -p "$NVDIR"; cp "$KO/nvidia.ko" "$NVDIR/nvidia-current.ko"; depmod "$KVER"
dkms_build real
grep -h 'symbol versions from\|WARNING' "$D/real.make.log" | sed 's/^/    /'
grep -q 'WARNING: modpost' "$D/real.make.log" && { say "FAIL: modpost warned"; fails=$((fails + 1)); }
modprobe --dump-modversions "$BUILT" | grep nvidia_p2p_ | sort -k2 >"$D/real.versions"
[[ -s $D/real.versions ]] || { say "FAIL: DKMS-built gdrcache.ko records no nvidia_p2p_* versions"; fails=$((fails + 1)); }
while read -r crc sym; do
	k=$(awk -v s="$sym" '$2 == s { print $1 }' "$KO/nvidia-ko.symvers")
	a=$(awk -v s="$sym" '$2 == s { print $1 }' "$SYMVERS")
	if [[ $crc == "$k" && $crc == "$a" ]]; then say "$sym $crc = nvidia.ko $PVER = nv-p2p.o (check-abi)"
	else say "FAIL: $sym: gdrcache.ko $crc, nvidia.ko ${k:-none}, nv-p2p.o ${a:-none}"; fails=$((fails + 1)); fi
done <"$D/real.versions"
m=$(modinfo -F version "$BUILT")
[[ $m == "$V" ]] && say "DKMS-built gdrcache.ko version $m = VERSION" || { say "FAIL: version '$m', VERSION '$V'"; fails=$((fails + 1)); }

# ---- 4. for the VM case ---------------------------------------------------------------------------
# nvidia.ko imports from Debian's own modules (535 with drm: drm_gem_object_free): take them, with
# what they need, from the kernel image tests/vm/run boots, fetched and unpacked exactly as it does
# (same cache, so it is downloaded once), staged as nvdep-NN-<name>.ko in load order.
S=$ROOT/tests/kmod/nvidia-real
rm -rf "$S"; mkdir -p "$S"
cp "$KO/nvidia.ko" "$S/nvidia.ko"
cp "$BUILT" "$S/gdrcache-dkms.ko"
VC=$ROOT/build/vm/cache
IPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)
IVER=$(apt-cache show --no-all-versions "$IPKG" 2>/dev/null | sed -n 's/^Version: //p' | head -1)
IDEB=$VC/${IPKG}_${IVER//:/%3a}_amd64.deb KTREE=$VC/$IPKG-$IVER
mkdir -p "$VC"
[[ -f $IDEB ]] || (cd "$VC" && gdr_apt download -q "$IPKG=$IVER" >/dev/null 2>&1) || true
if [[ -f $IDEB && ! -f $KTREE/.unpacked ]]; then
	rm -rf "$KTREE"; dpkg -x "$IDEB" "$KTREE" && depmod -b "$KTREE" "$KVER" && touch "$KTREE/.unpacked"
fi
if [[ -f $KTREE/.unpacked ]]; then
	i=0
	for dep in $(modinfo -F depends "$KO/nvidia.ko" | tr ',' ' '); do
		while read -r ko; do
			i=$((i + 1)); n=$(basename "$ko"); n=${n%%.ko*}
			case $ko in
			*.xz) xz -dc "$ko" ;; *.zst) zstd -qdc "$ko" ;; *.gz) gzip -dc "$ko" ;; *) cat "$ko" ;;
			esac >"$S/nvdep-$(printf %02d $i)-$n.ko"
		done < <(modprobe -D -d "$KTREE" -S "$KVER" "$dep" | sed -n 's/^insmod \([^ ]*\).*/\1/p')
	done
	say "nvidia.ko needs: $(modinfo -F depends "$KO/nvidia.ko"); staged $(cd "$S" && ls nvdep-* 2>/dev/null | tr '\n' ' ')"
else
	say "note: no $IPKG image to take nvidia.ko's dependencies from: the VM case will report unknown symbols"
fi
say "staged tests/kmod/nvidia-real/ for tests/vm/cases/28-nvidia-real-load.sh"
say "$((SECONDS - T0)) s"
((fails)) && { say "FAILED: $fails"; exit 1; }
say PASS
