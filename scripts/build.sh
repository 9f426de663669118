#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), configures once, builds incrementally.
#   usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"; shift || true
PY="$(scripts/setup.sh)"
if [ ! -f "$BUILD/build.ninja" ] || ! grep -q "ZT_PYTHON:STRING=$PY\$" "$BUILD/CMakeCache.txt" 2>/dev/null; then
  cmake -S . -B "$BUILD" -G Ninja -DZT_PYTHON="$PY" "$@" >&2
fi
# ZT_BUILD_TARGETS: build only these (default: everything).
ninja -C "$BUILD" ${ZT_BUILD_TARGETS:-} >&2
