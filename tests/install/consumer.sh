#!/usr/bin/env bash
# ctest install_consumer: the installed package is all a program needs.
#  1. cmake --install BUILD into a temporary prefix; the library, both executables, the
#     headers and the CMake package files are there, and every quoted #include of an
#     installed header names an installed header (none reaches into src/).
#  2. examples/CMakeLists.txt (find_package(zerotrain 0.8 REQUIRED), nothing else) is
#     configured against that prefix alone and builds examples/train_mlp.cpp.
#  3. The installed launcher runs it for 5 steps on 2 ranks; it must report the
#     project's version and finish.
#   usage: tests/install/consumer.sh BUILD_DIR VERSION [CMAKE] [GENERATOR] [CXX_COMPILER]
set -euo pipefail
src="$(cd "$(dirname "$0")/../.." && pwd)"
build="$(cd "$1" && pwd)"
version="$2"
cmake="${3:-cmake}"
generator="${4:-Ninja}"
cxx="${5:-c++}"
work="$(mktemp -d "${TMPDIR:-/tmp}/zt_install_consumer.XXXXXX")"
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"
t0=$SECONDS
step() { echo "[install_consumer +$((SECONDS - t0))s] $*"; }
# Runs a command with its output in a log that is shown only when it fails.
quiet() {
  local log="$work/$1.log"; shift
  "$@" >"$log" 2>&1 || { echo "FAILED: $*"; cat "$log"; exit 1; }
}

step "install into $prefix"
quiet install "$cmake" --install "$build" --prefix "$prefix"
for f in libzerotrain.a zerotrain zerotrain-rank engine.h version.h cifar10.h \
         zerotrainConfig.cmake zerotrainConfigVersion.cmake zerotrainTargets.cmake; do
  [ -n "$(find "$prefix" -name "$f" -print -quit)" ] || { echo "not installed: $f"; exit 1; }
done
bad=0
while IFS=: read -r file line; do
  inc="$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)".*/\1/' <<<"$line")"
  if [ ! -f "$prefix/include/$inc" ] && [ ! -f "$(dirname "$file")/$inc" ]; then
    echo "installed header ${file#"$prefix"/} includes \"$inc\", which is not installed"; bad=1
  fi
done < <(grep -rH '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$prefix/include")
[ "$bad" = 0 ]

step "configure examples/ against the installed package only"
quiet configure "$cmake" -S "$src/examples" -B "$work/app" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF \
  -DZT_EXAMPLES=train_mlp
found="$(sed -n 's/^zerotrain_DIR:PATH=//p' "$work/app/CMakeCache.txt")"
case "$found" in "$prefix"/*) ;; *) echo "find_package found zerotrain in '$found', not in $prefix"; exit 1 ;; esac

step "build train_mlp"
quiet build "$cmake" --build "$work/app"

step "run it: 2 ranks, 5 steps"
out="$(OMP_NUM_THREADS=1 "$prefix/bin/zerotrain" launch -n 2 -- "$work/app/train_mlp" "$src/configs/zero2.json" 5 2>&1)" ||
  { echo "$out"; exit 1; }
echo "$out"
# (zerotrain launch prefixes each line with "[rank R] ".)
grep -qF "] zerotrain $version, 2 rank(s), 5 steps" <<<"$out" || { echo "no 'zerotrain $version, 2 rank(s)' line"; exit 1; }
grep -qF "] step 4 loss" <<<"$out" || { echo "no 'step 4 loss' line"; exit 1; }
step "passed"
