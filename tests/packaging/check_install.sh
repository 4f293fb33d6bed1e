#!/bin/sh
# SPDX-License-Identifier: MIT
# Install the build into a scratch prefix, then build a separate project against it twice: with
# CMake's find_package(gdrcache) and with pkg-config; and preload the installed
# libgdrcache-preload.so with no library path set (it must find libgdrcache.so.0 in the directory
# above its own). Also: the preload lies at its documented path, LIBDIR/gdrcache/, and nowhere in
# LIBDIR itself; gdrcache.pc names the prefix installed to (no "..", no -I of libibverbs' own
# dependencies such as libnl3).
# Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name 'libgdrcache.so' | head -1)")
preload=$libdir/gdrcache/libgdrcache-preload.so
[ -f "$preload" ] || { echo "FAIL: no ${preload#"$prefix"/} (README, \"Installing it\")"; exit 1; }
stray=$(find "$libdir" -maxdepth 1 -name 'libgdrcache-preload*')
[ -z "$stray" ] || { echo "FAIL: the preload in the public library directory: $stray"; exit 1; }
# The preload from an install outside the system's library paths, nothing else set.
env -u LD_LIBRARY_PATH LD_PRELOAD="$preload" /bin/true ||
	{ echo "FAIL: LD_PRELOAD of the installed libgdrcache-preload.so"; exit 1; }
export PKG_CONFIG_PATH="$libdir/pkgconfig"
inc=$(pkg-config --variable=includedir gdrcache)
[ "$inc" = "$prefix/include" ] ||
	{ echo "FAIL: gdrcache.pc's includedir is $inc, not $prefix/include"; exit 1; }
cflags=$(pkg-config --cflags gdrcache | sed "s/ *$//")
[ "$cflags" = "-I$prefix/include" ] ||
	{ echo "FAIL: pkg-config --cflags gdrcache is '$cflags', not '-I$prefix/include'"; exit 1; }
export LD_LIBRARY_PATH="$libdir" GDRCACHE_KMOD_DEV=/nonexistent GDRCACHE_LOG=error
cmake -S "$src/tests/packaging/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
pkg-config --exists 'gdrcache >= 0.1'
# shellcheck disable=SC2046
cc -o "$tmp/pc_consumer" "$src/tests/packaging/consumer/main.c" $(pkg-config --cflags --libs gdrcache)
"$tmp/pc_consumer"
echo "ok: find_package(gdrcache) and pkg-config gdrcache (Cflags $cflags) both build and run a" \
	"consumer; the installed ${preload#"$prefix"/} loads on its own, none in ${libdir#"$prefix"/}/"
