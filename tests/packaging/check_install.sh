#!/bin/sh
# SPDX-License-Identifier: MIT
# Install the build into a scratch prefix, then build a separate project against it twice: with
# CMake's find_package(gdrcache) and with pkg-config; and preload the installed
# libgdrcache-preload.so with no library path set (it must find libgdrcache.so.0 beside it).
# Usage: check_install.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
libdir=$(dirname "$(find "$tmp/prefix" -name 'libgdrcache.so' | head -1)")
# The preload from an install outside the system's library paths, nothing else set.
env -u LD_LIBRARY_PATH LD_PRELOAD="$libdir/libgdrcache-preload.so" /bin/true ||
	{ echo "FAIL: LD_PRELOAD of the installed libgdrcache-preload.so"; exit 1; }
export LD_LIBRARY_PATH="$libdir" GDRCACHE_KMOD_DEV=/nonexistent GDRCACHE_LOG=error
cmake -S "$src/tests/packaging/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
"$tmp/consumer/consumer"
PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --exists 'gdrcache >= 0.1'
# shellcheck disable=SC2046
cc -o "$tmp/pc_consumer" "$src/tests/packaging/consumer/main.c" \
	$(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --cflags --libs gdrcache)
"$tmp/pc_consumer"
echo "ok: find_package(gdrcache) and pkg-config gdrcache both build and run a consumer;" \
	"the installed preload library loads on its own"
