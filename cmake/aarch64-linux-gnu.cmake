# SPDX-License-Identifier: MIT
# Cross-building for aarch64 (Grace) with Debian's cross compiler; ctest runs the tests under
# qemu-user. Packages (tests/deps.sh installs them): gcc-aarch64-linux-gnu, libc6-dev-arm64-cross,
# qemu-user, and the arm64 multiarch libraries (dpkg --add-architecture arm64; libibverbs-dev:arm64,
# libcmocka-dev:arm64). Usage:
#   cmake -S . -B build/arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
#   cmake --build build/arm64 && (cd build/arm64 && ctest -LE no-qemu)
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)

# Headers and libraries: the cross compiler's own libc (/usr/aarch64-linux-gnu) and Debian's arm64
# multiarch packages (/usr/include, /usr/lib/aarch64-linux-gnu: CMake drops a root path of "/", so
# the host's directories are searched after the root, BOTH; CMAKE_LIBRARY_ARCHITECTURE puts
# lib/aarch64-linux-gnu first; Debian keeps x86-64 libraries in lib/x86_64-linux-gnu). Programs
# are the host's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# pkg-config reads the arm64 .pc files only (never the host's x86-64 ones).
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
set(ENV{PKG_CONFIG_PATH} "")
set(ENV{PKG_CONFIG_SYSROOT_DIR} "")

# The emulator: ctest prefixes every test whose COMMAND is a target with it (qemu-user, called
# explicitly: no binfmt_misc, so a test that runs the programs from a host script or interpreter, or
# that execs one, cannot work: those carry the label no-qemu, tests/CMakeLists.txt). The loader
# and libc come from libc6:arm64 (installed with libibverbs1:arm64; -L /), the same build of glibc
# as the arm64 libraries they load; the cross libc in /usr/aarch64-linux-gnu is only linked against
# (with -L /usr/aarch64-linux-gnu its ld.so would run libc6:arm64's libc.so.6, another build).
# qemu-run.sh hands a test's LD_PRELOAD to the program, not to qemu.
set(GDR_QEMU_LD_PREFIX / CACHE PATH "qemu-aarch64 -L: the root its loader and libraries come from")
find_program(GDR_QEMU_AARCH64 qemu-aarch64 REQUIRED)
set(CMAKE_CROSSCOMPILING_EMULATOR
  sh ${CMAKE_CURRENT_LIST_DIR}/qemu-run.sh ${GDR_QEMU_AARCH64} ${GDR_QEMU_LD_PREFIX})
