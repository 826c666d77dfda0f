#!/usr/bin/env bash
# `cmake --install` yields a usable package: a project outside the tree finds it with
# find_package(Lifeline) and with pkg-config, builds, and saves and loads a checkpoint.
set -euo pipefail
build_dir="$1"
src="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d /tmp/lifeline-install-XXXXXX)"
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/lifeline/checkpoint.h"
test -f "$work/prefix/include/lifeline/c_api.h"
cmake -S "$src/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig" cmake -S "$src/consumer" -B "$work/build" >/dev/null
cmake --build "$work/build" -j 2 >/dev/null
for exe in consumer_cmake consumer_pkgconfig; do
  mkdir "$work/ckpt-$exe"
  LD_LIBRARY_PATH="$work/prefix/lib" "$work/build/$exe" "$work/ckpt-$exe"
done
echo "install_test: ok"
