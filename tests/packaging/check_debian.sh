#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Debian packages, end to end (tests/run's packages stage; root):
#   1. dpkg-buildpackage -b -us -uc on a copy of the tree (what git would commit, plus untracked
#      files it does not ignore), in build/deb: libgdrcache0, libgdrcache-dev, gdrcache-dkms,
#      gdrcache-tools; lintian --pedantic on the result (any tag at any level fails; an override
#      needs a comment that gives its reason); debian/libgdrcache0.symbols against dpkg-gensymbols'
#      view of the built library; the Maintainer not a placeholder
#   2. a clean Debian 12 root (debootstrap minbase with a compiler, CMake, pkg-config,
#      libibverbs-dev, DKMS and Debian's kernel headers), cached as build/deb-root-bookworm.tar.zst
#   3. in it: the packages installed with dpkg; a consumer built with pkg-config and with CMake's
#      find_package and run; gdrcache.pc's Cflags the prefix's include and nothing of libibverbs'
#      dependencies (libnl3); the preload at its documented path, outside the public library
#      directory, and loaded from there; gdrcache_info --json parsed; the udev rule, the
#      group, the modules-load entry and the manual pages in place; the module built with
#      `dkms build -k` for the headers' kernel (the chroot's uname is the host's)
# Exit 0 pass, 1 fail, 77 skip (Debian's archive unreachable). GDR_DEBIAN_MIRROR: another mirror.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/apt.sh
. "$ROOT/tests/apt.sh" # gdr_apt: waits for the apt/dpkg locks, one retry
OUT=$ROOT/build/deb
MIRROR=${GDR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=$ROOT/build/deb-root-bookworm.tar.zst
# What the root holds besides minbase (debootstrap resolves their dependencies); python3: gdrcache-tools's
# gdrcache_report.
ROOT_PKGS=gcc,libc6-dev,make,cmake,pkgconf,libibverbs-dev,dkms,linux-headers-amd64,adduser,kmod,python3
v=$(cat "$ROOT/VERSION")
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
step() { echo "[deb] $* ($(($(date +%s) - t0)) s)"; }
t0=$(date +%s)

[[ $(dpkg --print-architecture) == amd64 ]] || { echo "skip: the root and headers are amd64's"; exit 77; }
host=${MIRROR#*://}; host=${host%%/*}
if ! timeout 20 bash -c "exec 3<>/dev/tcp/$host/80" 2>/dev/null; then
	echo "skip: $MIRROR cannot be reached"
	exit 77
fi
need=()
for p in debhelper dh-dkms lintian debootstrap fakeroot zstd python3; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if ((${#need[@]})); then
	step "installing ${need[*]}"
	if ! { gdr_apt update -qq && DEBIAN_FRONTEND=noninteractive gdr_apt install -y -qq \
		--no-install-recommends "${need[@]}" >/dev/null; }; then
		echo "skip: cannot install ${need[*]} from Debian's archive"
		exit 77
	fi
fi

# ---- 1. build -------------------------------------------------------------------------------
src=$OUT/src/gdrcache-$v
umount "$OUT/root/proc" 2>/dev/null # left mounted by a run that was killed
rm -rf --one-file-system "$OUT"
mkdir -p "$src"
if git -C "$ROOT" rev-parse --git-dir >/dev/null 2>&1; then
	(cd "$ROOT" && git ls-files -co --exclude-standard -z | grep -zv '^build/' |
		xargs -0 cp -a --parents -t "$src" 2>/dev/null)
else
	tar -C "$ROOT" --exclude=./build --exclude=./.git -cf - . | tar -C "$src" -xf -
fi
step "dpkg-buildpackage -b"
if ! (cd "$src" && dpkg-buildpackage -b -us -uc -j"$(nproc)") >"$OUT/build.log" 2>&1; then
	tail -40 "$OUT/build.log"
	fail "dpkg-buildpackage -b"
	exit 1
fi
debs=("$OUT"/src/*.deb)
for p in libgdrcache0 libgdrcache-dev gdrcache-dkms gdrcache-tools; do
	ls "$OUT/src/${p}_${v}-"*.deb >/dev/null 2>&1 || fail "no $p package"
done
pass "dpkg-buildpackage -b: $(cd "$OUT/src" && ls ./*.deb | sed 's|^\./||' | tr '\n' ' ')"
step "lintian --pedantic"
lintian --pedantic --display-info --fail-on error,warning,info,pedantic --tag-display-limit 0 \
	"$OUT"/src/*.changes >"$OUT/lintian.log" 2>&1
rc=$?
sed 's/^/  lintian: /' "$OUT/lintian.log"
tags=$(grep -cE '^[EWIPX]: ' "$OUT/lintian.log")
((rc == 0 && tags == 0)) && pass "lintian --pedantic: no tag" || fail "lintian --pedantic: $tags tag(s)"
# Each override says why, on the comment lines just above it.
for o in "$ROOT"/debian/*lintian-overrides "$ROOT"/debian/source/lintian-overrides; do
	[[ -f $o ]] || continue
	awk -v f="${o#"$ROOT"/}" '/^#/ { why = 1; next } /^[[:space:]]*$/ { why = 0; next }
		!why { print "FAIL: " f ":" NR ": an override without a reason comment: " $0; bad = 1 }
		END { exit bad }' "$o" || fails=$((fails + 1))
done

step "symbols, Maintainer, the preload's documented path"
# Where the documents say the package puts the preload: /usr/lib/<triplet>/gdrcache/ (inside the
# root, the package's own file list is compared with it). README.md, preload/README.md and
# gdrcache(7) must give it; no document, docs/*.md included, may give the old path.
for d in README.md preload/README.md docs/man/gdrcache.man; do
	grep -q '/usr/lib/[^/ ]*/gdrcache/libgdrcache-preload\.so' "$ROOT/$d" ||
		fail "$d does not give the preload's path, /usr/lib/<triplet>/gdrcache/libgdrcache-preload.so"
done
for d in README.md preload/README.md docs/man/gdrcache.man "$ROOT"/docs/*.md; do
	d=${d#"$ROOT"/}
	old=$(grep -n '/usr/lib/[^/ ]*/libgdrcache-preload\.so' "$ROOT/$d")
	[[ -z $old ]] || fail "$d gives the preload's old path: $old"
done
# debian/libgdrcache0.symbols: in the package, and the same NAME@VERSION set as dpkg-gensymbols
# reads from the built library with no template; every public symbol's minimum version is its node's
# release (GDRCACHE_0.2 -> 0.2.0).
sym=$ROOT/debian/libgdrcache0.symbols
deb0=$(ls "$OUT/src/libgdrcache0_${v}-"*.deb 2>/dev/null | head -1)
x=$OUT/libgdrcache0.x
if [[ ! -f $sym ]]; then
	fail "no debian/libgdrcache0.symbols"
elif ! dpkg-deb -R "$deb0" "$x" 2>/dev/null || [[ ! -s $x/DEBIAN/symbols ]]; then
	fail "libgdrcache0's control area has no symbols file"
else
	so=$(find "$x" -name 'libgdrcache.so.0.*' -type f | head -1)
	(cd "$x" && dpkg-gensymbols -q -plibgdrcache0 -P"$x" -v"$v" -I/dev/null -e"$so" \
		-O"$OUT/symbols.gen") >/dev/null 2>&1
	names() { awk '/^ / { print $1 }' "$1" | sort; }
	if [[ -s $OUT/symbols.gen ]] &&
		diff <(names "$OUT/symbols.gen") <(names "$sym") >"$OUT/symbols.diff"; then
		pass "debian/libgdrcache0.symbols: dpkg-gensymbols' $(names "$sym" | wc -l) symbols of ${so##*/}"
	else
		sed 's/^/  symbols (< the library, > the file): /' "$OUT/symbols.diff"
		fail "debian/libgdrcache0.symbols differs from dpkg-gensymbols' view of ${so##*/}"
	fi
	bad=$(awk '/^ [^ ]+@GDRCACHE_[0-9]+\.[0-9]+ / { split($1, a, "@GDRCACHE_")
		if ($2 != a[2] ".0") print $1 " " $2 }' "$sym")
	[[ -z $bad ]] && pass "each public symbol's minimum version is its node's release" ||
		fail "minimum versions not their node's release: $bad"
fi
# The Maintainer (control, every changelog trailer, the packages) is one contact and none of the
# names reserved for examples (RFC 2606, RFC 6761).
mnt=$(sed -n 's/^Maintainer: *//p' "$ROOT/debian/control")
mhost=$(echo "$mnt" | sed -n 's/.*@\([^>]*\)>.*/\1/p' | tr A-Z a-z)
reserved='(^|\.)(example(\.(org|com|net))?|invalid|test|localhost|local|localdomain)$'
if [[ -z $mhost || $mhost =~ $reserved ]]; then
	fail "Maintainer '$mnt' is a placeholder"
else
	pass "Maintainer: $mnt"
fi
others=$(sed -n 's/^ -- \(.*>\)  .*/\1/p' "$ROOT/debian/changelog" | sort -u | grep -vxF "$mnt")
for d in "${debs[@]}"; do
	m=$(dpkg-deb -f "$d" Maintainer)
	[[ $m == "$mnt" ]] || others+=" ${d##*/}: $m"
done
[[ -z $others ]] && pass "debian/changelog's trailers and the packages name the same Maintainer" ||
	fail "other maintainers than debian/control's: $others"

# ---- 2. the root ----------------------------------------------------------------------------
rootfs=$OUT/root
if [[ ! -s $CACHE || $(cat "$CACHE.pkgs" 2>/dev/null) != "$ROOT_PKGS" ]]; then
	step "debootstrap bookworm (cached afterwards in ${CACHE#"$ROOT"/})"
	# It downloads from the mirror: a failed run (a broken-off download) is tried once more, in a
	# fresh directory (what a failed run left mounted there unmounted first).
	for try in 1 2; do
		for m in proc sys dev/pts dev; do
			mountpoint -q "$OUT/bootstrap/$m" 2>/dev/null && umount -l "$OUT/bootstrap/$m"
		done
		rm -rf --one-file-system "$OUT/bootstrap"
		debootstrap --variant=minbase --include="$ROOT_PKGS" --cache-dir=/var/cache/apt/archives \
			bookworm "$OUT/bootstrap" "$MIRROR" >"$OUT/debootstrap.log" 2>&1 && break
		tail -20 "$OUT/debootstrap.log"
		if ((try == 2)); then
			echo "skip: debootstrap from $MIRROR failed twice"
			exit 77
		fi
		echo "[deb] debootstrap from $MIRROR failed: trying once more in 15 s"
		sleep 15
	done
	tar -C "$OUT/bootstrap" -cf - . | zstd -q -T0 -3 -o "$CACHE.tmp" -f && mv "$CACHE.tmp" "$CACHE"
	echo "$ROOT_PKGS" >"$CACHE.pkgs"
	rm -rf "$OUT/bootstrap"
fi
step "a clean root from ${CACHE#"$ROOT"/}"
mkdir -p "$rootfs"
zstd -q -d -c "$CACHE" | tar -C "$rootfs" -xf -
mount -t proc proc "$rootfs/proc"
trap 'umount "$rootfs/proc" 2>/dev/null' EXIT
mkdir -p "$rootfs/tmp/gdr"
cp "${debs[@]}" "$rootfs/tmp/gdr/"
cp -r "$ROOT/tests/packaging/consumer" "$rootfs/tmp/gdr/consumer"
kver=$(cd "$rootfs/usr/src" && ls -d linux-headers-*-amd64 | sed 's/^linux-headers-//' | sort -V | tail -1)

# ---- 3. inside it ---------------------------------------------------------------------------
step "dpkg -i, consumers, gdrcache_info, dkms build -k $kver"
cat >"$rootfs/tmp/gdr/inside.sh" <<'INSIDE'
set -u
v=$1 kver=$2
cd /tmp/gdr
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
pass() { echo "ok: $*"; }
export GDRCACHE_KMOD_DEV=/nonexistent GDRCACHE_LOG=error
# dkms's postinst builds for `uname -r`, whose headers are not here: it says so and goes on.
if dpkg -i ./*.deb >dpkg.log 2>&1; then pass "dpkg -i of the four packages"; else cat dpkg.log; fail "dpkg -i"; fi
[ "$(pkg-config --modversion gdrcache)" = "$v" ] && pass "pkg-config gdrcache: $v" || fail "pkg-config --modversion"
# The prefix's include and nothing else: no path through the .pc file's own place, nothing of
# libibverbs' Requires.private (libnl's -I/usr/include/libnl3). /usr/include is a system directory,
# which pkgconf leaves out unless asked.
c=$(PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1 pkg-config --cflags gdrcache | sed 's/ *$//')
inc=$(pkg-config --variable=includedir gdrcache)
if [ "$c" = "-I/usr/include" ] && [ "$inc" = /usr/include ] &&
	[ -z "$(pkg-config --cflags gdrcache | tr -d ' ')" ]; then
	pass "pkg-config --cflags gdrcache: '$c' with the system's directories, '' without"
else
	fail "pkg-config gdrcache: Cflags '$c', includedir '$inc' (want -I/usr/include, no libnl3)"
fi
# shellcheck disable=SC2046
if cc -o pc_consumer consumer/main.c $(pkg-config --cflags --libs gdrcache) && ./pc_consumer; then
	pass "a consumer built with pkg-config runs"
else
	fail "pkg-config consumer"
fi
if cmake -S consumer -B cm >cmake.log 2>&1 && cmake --build cm >>cmake.log 2>&1 && ./cm/consumer; then
	pass "a consumer built with find_package(gdrcache) runs"
else
	cat cmake.log; fail "CMake consumer"
fi
# The preload at the path README.md ("Installing it") and gdrcache(7) give, and nowhere in the public
# library directory; loaded from there (a preload ld.so cannot load is only warned about, so the
# process's own map says).
ma=$(gcc -print-multiarch)
doc=/usr/lib/$ma/gdrcache/libgdrcache-preload.so
lib=$(dpkg -L libgdrcache0 | grep 'libgdrcache-preload')
[ "$lib" = "$doc" ] && pass "the preload is $doc" || fail "the preload is '$lib', not $doc"
stray=$(ls /usr/lib/"$ma"/libgdrcache-preload* /lib/"$ma"/libgdrcache-preload* 2>/dev/null)
[ -z "$stray" ] || fail "the preload in the public library directory: $stray"
if env LD_PRELOAD="$doc" cat /proc/self/maps 2>preload.err | grep -q "$doc" &&
	! grep -q 'cannot be preloaded\|cannot open shared object' preload.err; then
	pass "LD_PRELOAD=$doc: loaded, with libgdrcache.so.0 found"
else
	cat preload.err; fail "LD_PRELOAD=$doc does not load"
fi
gdrcache_info -c --json >info.json 2>info.err; echo $? >info.rc
for f in /usr/lib/udev/rules.d/60-gdrcache.rules /usr/lib/modules-load.d/gdrcache.conf \
	/usr/share/man/man7/gdrcache.7.gz /usr/share/man/man1/gdrcache_info.1.gz \
	/usr/share/man/man3/gdr_reg.3.gz /usr/share/man/man3/gdr_region_keys.3.gz \
	"/usr/src/gdrcache-$v/dkms.conf" "/usr/src/gdrcache-$v/kmod/Kbuild" \
	"/usr/src/gdrcache-$v/include/gdrcache/uapi.h" "/usr/src/gdrcache-$v/VERSION"; do
	[ -e "$f" ] || fail "$f missing"
done
getent group gdrcache >/dev/null && pass "the group gdrcache exists" || fail "no group gdrcache"
dkms status | grep -q "^gdrcache/$v" && pass "dkms knows gdrcache/$v" || fail "dkms status: $(dkms status)"
if dkms build -m gdrcache -v "$v" -k "$kver" >dkms.log 2>&1; then
	ko=$(find "/var/lib/dkms/gdrcache/$v/$kver" -name 'gdrcache.ko*' | head -1)
	if [ -n "$ko" ] && /sbin/modinfo -F vermagic "$ko" | grep -q "^$kver "; then
		pass "dkms build -k $kver: $(basename "$ko"), vermagic $kver, version $(/sbin/modinfo -F version "$ko")"
	else
		fail "dkms build made no module for $kver"
	fi
else
	tail -30 dkms.log; tail -30 "/var/lib/dkms/gdrcache/$v/build/make.log" 2>/dev/null
	fail "dkms build -k $kver"
fi
exit $fails
INSIDE
chroot "$rootfs" /bin/bash /tmp/gdr/inside.sh "$v" "$kver"
fails=$((fails + $?))
rc=$(cat "$rootfs/tmp/gdr/info.rc" 2>/dev/null)
if [[ $rc == 0 ]] && python3 - "$rootfs/tmp/gdr/info.json" "$v" <<'PY'; then
import json, sys
j = json.load(open(sys.argv[1]))
assert j["library"]["version"] == sys.argv[2], j["library"]
assert j["config"]["GDRCACHE_LOG_FILE"]["default"] == "stderr", j["config"]
assert j["config"]["GDRCACHE_STATS"]["value"] == "0", j["config"]
PY
	pass "gdrcache_info -c --json in the root: valid JSON, version $v"
else
	cat "$rootfs/tmp/gdr/info.json" "$rootfs/tmp/gdr/info.err" 2>/dev/null | head -20
	fail "gdrcache_info -c --json (exit $rc)"
fi
umount "$rootfs/proc"
trap - EXIT
step "done"
((fails == 0)) || { echo "$fails check(s) failed (the root is kept in ${rootfs#"$ROOT"/})"; exit 1; }
rm -rf --one-file-system "$rootfs"
echo "all passed"
