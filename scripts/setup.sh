#!/usr/bin/env bash
# Installs what zerotrain needs and is missing; prints the python that holds torch 2.11.
# Re-running on a ready machine takes seconds (every step checks before it acts).
#   ZT_VENV   where the per-user virtualenv lives (default: ~/.cache/zerotrain/venv)
#   ZT_PYTHON use this python (must import torch 2.11) and skip the virtualenv
set -euo pipefail
TORCH_VERSION=2.11.0
log() { echo "[setup] $*" >&2; }

# 1. Debian packages (only the missing ones; needs root or sudo).
need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
if have_cmd dpkg-query; then
  for p in g++ cmake ninja-build libopenmpi-dev openmpi-bin nlohmann-json3-dev libgtest-dev ccache python3-venv make; do
    have_pkg "$p" || need+=("$p")
  done
fi
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif have_cmd sudo; then SUDO="sudo"; else
    log "missing Debian packages: ${need[*]} (no root and no sudo: install them, then re-run)"; exit 1; fi
  log "installing Debian packages: ${need[*]}"
  if ! { $SUDO apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >&2; }; then
    # A machine without a package registry (e.g. an offline GPU host) may still have the
    # tools from elsewhere: go on when the essential ones are there, and say so.
    for c in g++ cmake ninja mpicc; do have_cmd "$c" || { log "cannot install ${need[*]} and $c is missing"; exit 1; }; done
    log "warning: could not install ${need[*]}; continuing with the tools found on PATH"
  fi
fi

# tensorboard, for the test that reads zerotrain's event files with TensorBoard's own
# reader (tests/unit/test_monitor.cpp; it skips, saying why, without it). Installed
# into zerotrain's virtualenv only (step 2 below); another python gets a note.
tensorboard_ok() { "$1" -c "import tensorboard" >/dev/null 2>&1; }
note_tensorboard() {
  tensorboard_ok "$1" || log "note: $1 has no tensorboard; the TensorBoard reader test will skip (pip install tensorboard)"
}

# 2. torch 2.11 (LibTorch headers and libraries come with the wheel).
torch_ok() { "$1" -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('${TORCH_VERSION%.*}') else 1)" >/dev/null 2>&1; }
if [ -n "${ZT_PYTHON:-}" ]; then
  torch_ok "$ZT_PYTHON" || { log "ZT_PYTHON=$ZT_PYTHON does not import torch $TORCH_VERSION"; exit 1; }
  note_tensorboard "$ZT_PYTHON"
  echo "$ZT_PYTHON"; exit 0
fi
for py in python3 python; do
  if have_cmd "$py" && torch_ok "$py"; then note_tensorboard "$py"; echo "$(command -v $py)"; exit 0; fi
done
VENV="${ZT_VENV:-$HOME/.cache/zerotrain/venv}"
if ! torch_ok "$VENV/bin/python"; then
  log "installing torch==$TORCH_VERSION into $VENV (first time only; a few minutes)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy >&2
fi
if ! tensorboard_ok "$VENV/bin/python"; then
  log "installing tensorboard into $VENV (the test that reads zerotrain's event files with it)"
  "$VENV/bin/pip" install -q tensorboard >&2 || log "warning: could not install tensorboard; the TensorBoard reader test will skip"
fi
echo "$VENV/bin/python"
