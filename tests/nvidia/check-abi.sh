#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# gdrcache.ko against NVIDIA's real P2P interface (issue 15, item 1).
#
# Fetches Debian's nvidia-open-kernel-source (contrib) and nvidia-kernel-source (non-free) through
# a private apt configuration (the system's sources are not touched), then:
#   1. compares kmod/nv_p2p_abi.h with NVIDIA's nv-p2p.h (open module, its nvidia-peermem copy and
#      the proprietary module's copy): every macro we define (values, and the version macros
#      evaluated), the page size enum, sizeof/offsetof/signedness of every structure member, the
#      typedefs, and every prototype we declare (gcc -aux-info, normalised);
#   2. builds NVIDIA's own nv-p2p.o (conftest + that one object of nvidia.ko) against Debian's
#      headers and takes the nvidia_p2p_* symbol versions (CRCs) modpost would see, into a
#      Module.symvers;
#   3. builds tests/kmod/nvp2p_sim.ko (a copy, from our header) and requires its CRCs to equal the
#      real ones for every nvidia_p2p_* symbol gdrcache.ko imports;
#   4. builds gdrcache.ko against the real nv-p2p.h and against ours, each linked (modpost, no
#      KBUILD_MODPOST_WARN) against the real Module.symvers, and requires the CRCs in its
#      __versions to be the real ones.
# Exit 0: all matched; 77: skipped (packages not fetchable, not Debian, no root for a missing
# package); anything else: a mismatch or a build failure. Work and download cache: build/nvidia.
# Env: GDR_NVIDIA_SUITE (default: this system's codename), GDR_NVIDIA_MIRROR, GDR_NVIDIA_ABI_HEADER
# (another header in place of kmod/nv_p2p_abi.h: to see this check fail).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=tests/apt.sh
. "$ROOT/tests/apt.sh" # gdr_apt: waits for the apt/dpkg locks, one retry
PATH=$PATH:/usr/sbin:/sbin # modprobe
W=$ROOT/build/nvidia
T0=$SECONDS
say() { echo "[nvidia-abi] $*"; }
skip() { say "SKIP: $*"; exit 77; }
die() { say "FAIL: $*"; exit 1; }
mkdir -p "$W"

# ---- prerequisites ------------------------------------------------------------------------------
[[ -r /etc/os-release ]] && . /etc/os-release
[[ ${ID-} == debian ]] || skip "not Debian (${ID-unknown})"
SUITE=${GDR_NVIDIA_SUITE:-${VERSION_CODENAME-}}
MIRROR=${GDR_NVIDIA_MIRROR:-http://deb.debian.org/debian}
[[ -n $SUITE ]] || skip "no Debian codename"
# Debian's headers for the kernel linux-image-amd64 names (as tests/vm/run resolves them).
HPKG=$(apt-cache depends linux-headers-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-headers-[0-9].*-amd64\)$/\1/p' | head -1)
[[ -n $HPKG ]] || skip "cannot resolve linux-headers-amd64"
need=()
dpkg-query -W -f='${Status}' "$HPKG" 2>/dev/null | grep -q 'install ok installed' || need+=("$HPKG")
for p in xz-utils gcc make libc6-dev kmod; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
done
if ((${#need[@]})); then
	((EUID == 0)) || skip "missing ${need[*]} and not root"
	say "installing ${need[*]}"
	DEBIAN_FRONTEND=noninteractive gdr_apt install -y -qq --no-install-recommends "${need[@]}" >/dev/null ||
		die "apt-get install ${need[*]}"
fi
KDIR=/usr/src/$HPKG
[[ -d $KDIR ]] || die "$KDIR missing"

# ---- fetch NVIDIA's sources (private apt config: contrib + non-free, nothing installed) --------
A=$W/apt
mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$W/debs"
KR=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -r $KR ]] && SB="[signed-by=$KR] " || SB=
cat >"$A/sources.list" <<EOF
deb $SB$MIRROR $SUITE contrib non-free non-free-firmware
deb $SB$MIRROR $SUITE-updates contrib non-free
deb $SB${MIRROR%/debian}/debian-security $SUITE-security contrib non-free
EOF
APT=(-o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache" -o APT::Sandbox::User=root
     -o Debug::NoLocking=1 -o Acquire::Retries=2)
if ! gdr_apt --timeout 120 "${APT[@]}" -qq update >"$W/apt.log" 2>&1; then
	tail -5 "$W/apt.log"; skip "apt-get update of $SUITE contrib/non-free failed"
fi
debs=()
for p in nvidia-open-kernel-source nvidia-kernel-source; do
	v=$(apt-cache "${APT[@]}" policy "$p" 2>/dev/null | sed -n 's/^ *Candidate: //p')
	[[ -n $v && $v != "(none)" ]] || skip "$p not in $SUITE contrib/non-free"
	f=$(ls "$W/debs/${p}_${v/*:/}_"*.deb 2>/dev/null | head -1)
	if [[ -z $f ]]; then
		(cd "$W/debs" && gdr_apt --timeout 300 "${APT[@]}" -qq download "$p=$v" >>"$W/apt.log" 2>&1) ||
			skip "apt-get download $p=$v failed"
		f=$(ls "$W/debs/${p}_${v/*:/}_"*.deb | head -1)
	fi
	debs+=("$f")
	say "$p $v"
done
OPEN_DEB=${debs[0]} PROP_DEB=${debs[1]}
OPEN_VER=$(dpkg-deb -f "$OPEN_DEB" Version) PROP_VER=$(dpkg-deb -f "$PROP_DEB" Version)

# Unpack once per version.
unpack() { # deb dir filter...
	local deb=$1 dir=$2; shift 2
	[[ -f $dir/.done ]] && return 0
	rm -rf "$dir"; mkdir -p "$dir"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$dir" --wildcards './usr/src/*.tar.xz' || return 1
	xz -dc "$dir"/usr/src/*.tar.xz | tar -x -C "$dir" "$@" || return 1
	rm -rf "$dir/usr"; touch "$dir/.done"
}
OPEN=$W/open-$OPEN_VER PROP=$W/prop-$PROP_VER
unpack "$OPEN_DEB" "$OPEN" || die "unpacking $OPEN_DEB"
unpack "$PROP_DEB" "$PROP" --wildcards '*/nv-p2p.h' '*/nv-p2p.c' || die "unpacking $PROP_DEB"
OSRC=$(dirname "$(find "$OPEN" -path '*/nvidia/nv-p2p.c' | head -1)")
OSRC=${OSRC%/nvidia}
[[ -f $OSRC/nvidia/nv-p2p.h && -f $OSRC/Kbuild ]] || die "no nvidia/nv-p2p.h in $OPEN_DEB"
mapfile -t HEADERS < <(find "$OPEN" "$PROP" -name nv-p2p.h | sort)
say "headers: ${HEADERS[*]#$W/}"
say "fetch+unpack: $((SECONDS - T0)) s"

fails=0 noted=" "
bad() { say "MISMATCH: $*"; fails=$((fails + 1)); }

# ---- 1. header comparison (user space, both headers through the same probe) --------------------
OURS=${GDR_NVIDIA_ABI_HEADER:-$ROOT/kmod/nv_p2p_abi.h} # another header: to test this check
P=$W/probe
mkdir -p "$P"
# Every object-like NVIDIA_P2P_* macro of ours, by value; function-like ones are evaluated below.
mapfile -t MACROS < <(sed -n 's/^#define[ \t]\+\(NVIDIA_P2P_[A-Z0-9_]\+\)\([ \t].*\)\?$/\1/p' "$OURS")
{
	echo '#include <stddef.h>'
	echo '#include <stdint.h>'
	echo '#include <stdio.h>'
	echo '#include HDR'
	echo '#define S(t) printf("sizeof %s %zu\n", #t, sizeof(t))'
	echo '#define O(t, m) printf("member %s.%s off %zu size %zu\n", #t, #m, offsetof(t, m), sizeof(((t *)0)->m))'
	echo '#define I(t, m) printf("member %s.%s signed %d\n", #t, #m, (__typeof__(((t *)0)->m))-1 < 0)'
	echo '#define TD(a, b) printf("typedef %s = %s %d\n", #a, #b, __builtin_types_compatible_p(a, b))'
	echo 'struct vt { uint32_t version; };'
	echo 'int main(void) {'
	for m in "${MACROS[@]}"; do
		printf '#if defined(%s)\n\tprintf("macro %s defined\\n");\n' "$m" "$m"
		printf '#else\n\tprintf("macro %s absent\\n");\n#endif\n' "$m"
	done
	for m in "${MACROS[@]}"; do
		[[ $m == NVIDIA_P2P_CAP_* ]] && continue
		printf '#if defined(%s)\n\tprintf("value %s 0x%%llx\\n", (unsigned long long)(%s));\n#endif\n' "$m" "$m" "$m"
	done
	cat <<'EOF'
	static const uint32_t v[] = { 0, 1, 2, 3, 0x00010000, 0x00010001, 0x00010002, 0x00010003,
		0x0001ffff, 0x00020000, 0x00020002, 0x00020003, 0x00020004, 0x00030003, 0xffff0002,
		0xffffffff };
	for (unsigned i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		struct vt p = { v[i] };
		printf("version 0x%08x major %u minor %u pt_compat %d dma_compat %d matches %d\n", v[i],
		       (unsigned)NVIDIA_P2P_MAJOR_VERSION(v[i]), (unsigned)NVIDIA_P2P_MINOR_VERSION(v[i]),
		       NVIDIA_P2P_PAGE_TABLE_VERSION_COMPATIBLE(&p) ? 1 : 0,
		       NVIDIA_P2P_DMA_MAPPING_VERSION_COMPATIBLE(&p) ? 1 : 0,
		       NVIDIA_P2P_MAJOR_VERSION_MATCHES(&p, 0x00010002) ? 1 : 0);
	}
	printf("enum 4KB %d 64KB %d 128KB %d COUNT %d\n", NVIDIA_P2P_PAGE_SIZE_4KB,
	       NVIDIA_P2P_PAGE_SIZE_64KB, NVIDIA_P2P_PAGE_SIZE_128KB, NVIDIA_P2P_PAGE_SIZE_COUNT);
	S(enum nvidia_p2p_page_size_type);
	S(struct nvidia_p2p_page);
	O(struct nvidia_p2p_page, physical_address); I(struct nvidia_p2p_page, physical_address);
	O(struct nvidia_p2p_page, registers);
	O(struct nvidia_p2p_page, registers.fermi);
	O(struct nvidia_p2p_page, registers.fermi.wreqmb_h); I(struct nvidia_p2p_page, registers.fermi.wreqmb_h);
	O(struct nvidia_p2p_page, registers.fermi.rreqmb_h); I(struct nvidia_p2p_page, registers.fermi.rreqmb_h);
	O(struct nvidia_p2p_page, registers.fermi.rreqmb_0); I(struct nvidia_p2p_page, registers.fermi.rreqmb_0);
	O(struct nvidia_p2p_page, registers.fermi.reserved);
	S(union nvidia_p2p_request_registers);
	S(struct nvidia_p2p_page_table);
	O(struct nvidia_p2p_page_table, version); I(struct nvidia_p2p_page_table, version);
	O(struct nvidia_p2p_page_table, page_size); I(struct nvidia_p2p_page_table, page_size);
	O(struct nvidia_p2p_page_table, pages);
	O(struct nvidia_p2p_page_table, entries); I(struct nvidia_p2p_page_table, entries);
	O(struct nvidia_p2p_page_table, gpu_uuid);
	TD(__typeof__(*((struct nvidia_p2p_page_table *)0)->pages), struct nvidia_p2p_page *);
	TD(__typeof__(((struct nvidia_p2p_page_table *)0)->gpu_uuid), uint8_t *);
	S(struct nvidia_p2p_dma_mapping);
	O(struct nvidia_p2p_dma_mapping, version); I(struct nvidia_p2p_dma_mapping, version);
	O(struct nvidia_p2p_dma_mapping, page_size_type);
	O(struct nvidia_p2p_dma_mapping, entries); I(struct nvidia_p2p_dma_mapping, entries);
	O(struct nvidia_p2p_dma_mapping, dma_addresses);
	O(struct nvidia_p2p_dma_mapping, private);
	O(struct nvidia_p2p_dma_mapping, pci_dev);
	TD(__typeof__(((struct nvidia_p2p_dma_mapping *)0)->dma_addresses), uint64_t *);
	TD(__typeof__(((struct nvidia_p2p_dma_mapping *)0)->pci_dev), struct pci_dev *);
	TD(nvidia_p2p_page_t, struct nvidia_p2p_page);
	TD(nvidia_p2p_page_table_t, struct nvidia_p2p_page_table);
	TD(nvidia_p2p_dma_mapping_t, struct nvidia_p2p_dma_mapping);
	return 0;
}
EOF
} >"$P/layout.c"
probe() { # header out-prefix
	local h=$1 o=$2
	gcc -std=gnu11 -Wall -Werror -include stddef.h -include stdint.h -DHDR="\"$h\"" \
		-o "$o.bin" "$P/layout.c" || return 1
	"$o.bin" >"$o.layout" || return 1
	# Prototypes as the compiler sees them, names and positions stripped.
	printf '#include <stddef.h>\n#include <stdint.h>\n#include "%s"\n' "$h" >"$o.c"
	gcc -std=gnu11 -fsyntax-only -aux-info "$o.aux" "$o.c" || return 1
	grep -E '\bnvidia_p2p_[a-z_]+ \(' "$o.aux" | sed -e 's,^/\*[^*]*\*/ *,,' -e 's/  */ /g' |
		sort -u >"$o.protos"
}
probe "$OURS" "$P/ours" || die "probe of our header does not build"
for h in "${HEADERS[@]}"; do
	n=${h#$W/}; n=${n//\//_}
	probe "$h" "$P/$n" || { bad "$n: probe does not compile"; continue; }
	# Macros: each of ours defined with our value. Exception: the FLAGS_* names, first defined
	# after 535 (NVIDIA_P2P_FLAGS_DEFAULT 0, FORCE_BAR1_MAPPING 1); gdrcache.c defines DEFAULT 0.
	for m in "${MACROS[@]}"; do
		if grep -qx "macro $m absent" "$P/$n.layout"; then
			if [[ $m == NVIDIA_P2P_FLAGS_* ]]; then [[ $noted == *" $m "* ]] || say "note: no $m in 535 ($n...; newer drivers only)"; noted+=" $m "
			else bad "$n: no $m"; fi
			continue
		fi
		o=$(grep "^value $m " "$P/ours.layout") r=$(grep "^value $m " "$P/$n.layout")
		[[ $o == "$r" ]] || bad "$n: ours '$o', real '$r'"
	done
	if ! diff <(grep -vE '^(macro|value) ' "$P/ours.layout") <(grep -vE '^(macro|value) ' "$P/$n.layout") >"$P/$n.diff"; then
		bad "$n: layout/enum/version-macro differences (< ours, > real):"; cat "$P/$n.diff"
	fi
	# Every prototype we declare must be the real one, token for token (the real header has more).
	while read -r proto; do
		f=$(sed -E 's/.*\b(nvidia_p2p_[a-z_]+) \(.*/\1/' <<<"$proto")
		real=$(grep -E "\b$f \(" "$P/$n.protos")
		[[ $real == "$proto" ]] || bad "$n: prototype of $f: ours '$proto', real '${real:-absent}'"
	done <"$P/ours.protos"
done
say "header comparison: $(wc -l <"$P/ours.protos") prototypes, $(grep -c . "$P/ours.layout") layout/macro lines, ${#HEADERS[@]} headers; $((SECONDS - T0)) s"

# ---- 2. NVIDIA's nv-p2p.o: the symbol versions nvidia.ko exports -------------------------------
NVB=$OSRC # built in place: the unpacked tree is ours
SYMVERS=$W/nvidia-$OPEN_VER-$HPKG.symvers
if [[ ! -s $SYMVERS ]]; then
	t=$SECONDS
	KSRC=$(sed -n 's,^include \(/.*\)/Makefile$,\1,p' "$KDIR/Makefile" | head -1)
	[[ -d $KSRC ]] || KSRC=$KDIR
	if ! make -C "$KDIR" M="$NVB" ARCH=x86_64 NV_KERNEL_SOURCES="$KSRC" NV_KERNEL_OUTPUT="$KDIR" \
		NV_KERNEL_MODULES=nvidia -j"$(nproc)" nvidia/nv-p2p.o >"$W/nvbuild.log" 2>&1; then
		tail -30 "$W/nvbuild.log"; die "NVIDIA's nv-p2p.o does not build against $HPKG"
	fi
	# Kernel 6.x records each export's CRC in the object's .cmd file (#SYMVER); modpost reads it.
	grep '^#SYMVER nvidia_p2p_' "$NVB/nvidia/.nv-p2p.o.cmd" |
		awk '{ printf "%s\t%s\tnvidia\tEXPORT_SYMBOL\t\n", $3, $2 }' >"$SYMVERS.tmp"
	[[ -s $SYMVERS.tmp ]] || die "no #SYMVER lines in nv-p2p.o's .cmd (is CONFIG_MODVERSIONS off?)"
	mv "$SYMVERS.tmp" "$SYMVERS"
	say "nv-p2p.o (conftest + 1 object) built in $((SECONDS - t)) s"
fi
say "real exports ($OPEN_VER, $HPKG):"; sed 's/^/    /' "$SYMVERS"

# ---- 3. the simulator's CRCs ------------------------------------------------------------------
S=$W/sim; rm -rf "$S"; mkdir -p "$S"
cp "$ROOT/tests/kmod/nvp2p_sim.c" "$ROOT/tests/kmod/nvp2p_sim_uapi.h" "$S/"
cp "$OURS" "$S/nv_p2p_abi.h"
printf 'obj-m := nvp2p_sim.o\nccflags-y += -I$(src)\n' >"$S/Kbuild"
make -C "$KDIR" M="$S" modules >"$S/build.log" 2>&1 || { tail -20 "$S/build.log"; die "nvp2p_sim.ko does not build"; }
# The functions gdrcache.c calls: the simulator must export them with NVIDIA's CRCs. Its other
# exports are reported only (their CRC also depends on which kernel structures the exporting
# file sees: NVIDIA's sees struct pci_dev's definition, for the dma ones).
mapfile -t USED < <(grep -o '\bnvidia_p2p_[a-z_]*(' "$ROOT/kmod/gdrcache.c" | tr -d '(' | sort -u)
while read -r crc sym _; do
	rc=$(awk -v s="$sym" '$2 == s { print $1 }' "$SYMVERS")
	[[ $crc == "$rc" ]] && continue
	if [[ " ${USED[*]} " == *" $sym "* ]]; then
		bad "nvp2p_sim exports $sym with CRC $crc, NVIDIA with ${rc:-none} (our header's declaration differs)"
	else
		say "note: nvp2p_sim's $sym CRC $crc != NVIDIA's ${rc:-none} (gdrcache.ko does not call it)"
	fi
done <"$S/Module.symvers"
for sym in "${USED[@]}"; do
	grep -q "	$sym	" "$S/Module.symvers" || bad "nvp2p_sim does not export $sym"
	grep -q "	$sym	" "$SYMVERS" || bad "NVIDIA does not export $sym"
done

# ---- 4. gdrcache.ko against the real header and ours, linked against the real symvers ----------
G=$W/gdr; rm -rf "$G"; mkdir -p "$G/hdr"
cp "$OSRC/nvidia/nv-p2p.h" "$G/hdr/"
for v in real ours; do
	mkdir -p "$G/$v/kmod"
	cp "$ROOT"/kmod/{gdrcache.c,Kbuild,Makefile,check-no-gpl-symbols.sh,nvidia-symvers.sh} "$G/$v/kmod/"
	cp "$ROOT/VERSION" "$G/$v/"
	cp "$OURS" "$G/$v/kmod/nv_p2p_abi.h"
	ln -sfn "$ROOT/include" "$G/$v/include"
	args=(KDIR="$KDIR" KBUILD_EXTRA_SYMBOLS="$SYMVERS" GDR_WERROR=1)
	[[ $v == real ]] && args+=(NVIDIA_SRC="$G/hdr")
	if ! make -C "$G/$v/kmod" "${args[@]}" >"$G/$v.log" 2>&1; then
		grep -E 'error|WARNING|undefined' "$G/$v.log" | head -20
		bad "gdrcache.ko does not build/link against $v nv-p2p ABI + real Module.symvers"
		continue
	fi
	grep -E 'WARNING: modpost' "$G/$v.log" && bad "modpost warned ($v)"
	modprobe --dump-modversions "$G/$v/kmod/gdrcache.ko" | grep nvidia_p2p_ | sort -k2 >"$G/$v.versions"
	[[ -s $G/$v.versions ]] || bad "gdrcache.ko ($v) records no nvidia_p2p_* versions"
	while read -r crc sym; do
		rc=$(awk -v s="$sym" '$2 == s { print $1 }' "$SYMVERS")
		[[ $crc == "$rc" ]] || bad "gdrcache.ko ($v): $sym $crc, nvidia exports ${rc:-nothing}"
	done <"$G/$v.versions"
	say "gdrcache.ko ($v header) imports: $(awk '{ printf "%s %s  ", $2, $1 }' "$G/$v.versions")"
done
# The proprietary module's exports come from its own copy of nv-p2p.c (not built here: a second
# conftest run would double the time); when it is the open one's, so are its prototypes.
PC=$(find "$PROP" -path '*/nvidia/nv-p2p.c' | head -1)
if [[ -n $PC ]] && cmp -s "$PC" "$OSRC/nvidia/nv-p2p.c"; then
	say "proprietary $PROP_VER nvidia/nv-p2p.c is identical to the open $OPEN_VER one"
else
	say "note: proprietary $PROP_VER nvidia/nv-p2p.c differs from the open one (its header was compared above)"
fi
say "open $OPEN_VER, proprietary $PROP_VER, headers $HPKG; $((SECONDS - T0)) s"
if ((fails)); then say "FAILED: $fails mismatch(es)"; exit 1; fi
say "PASS"
