#!/bin/sh
# Install the build into a scratch prefix, then compile and run a program calling
# spconv_version() against it twice: through pkg-config and through find_package(spconv).
# Usage: install_consumer.sh BUILD_DIR C_COMPILER CMAKE
set -eu
build=$1 cc=$2 cmake=$3
scratch=$(mktemp -d "${TMPDIR:-/tmp}/spconv_install.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
prefix=$scratch/prefix
"$cmake" --install "$build" --prefix "$prefix" >/dev/null
cat >"$scratch/main.c" <<'C'
#include <stdio.h>
#include <spconv/spconv.h>
int main(void) {
    printf("%u %s\n", spconv_version(), spconv_version_string());
    return spconv_version() == SPCONV_VERSION_NUMBER ? 0 : 1;
}
C
libdir=$(dirname "$(find "$prefix" -name spconv.pc)")
if command -v pkg-config >/dev/null; then
    PKG_CONFIG_PATH=$libdir "$cc" "$scratch/main.c" -o "$scratch/pc_user" \
        $(PKG_CONFIG_PATH=$libdir pkg-config --cflags --libs spconv)
    LD_LIBRARY_PATH=$libdir/.. "$scratch/pc_user"
fi
cat >"$scratch/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(spconv REQUIRED)
add_executable(shared_user main.c)
target_link_libraries(shared_user PRIVATE spconv::spconv)
add_executable(static_user main.c)
target_link_libraries(static_user PRIVATE spconv::spconv_static)
CM
"$cmake" -S "$scratch" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" >/dev/null
"$cmake" --build "$scratch/build" >/dev/null
"$scratch/build/shared_user"
"$scratch/build/static_user"
