#!/usr/bin/env bash
# The main job: gpt2-tiny, ZeRO stage 2, 2 ranks, on real English text that every Debian
# machine has offline (the GNU GPL text from base-files, plus this project's docs).
# On a machine with GPUs the same command trains on them (one GPU per rank).
#   usage: scripts/demo.sh [BUILD_DIR]     (make demo)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"
TEXT="$BUILD/demo_text.txt"
sources=(/usr/share/common-licenses/GPL-3 README.md docs/*.md)
cat "${sources[@]}" 2>/dev/null > "$TEXT" || true
[ -s "$TEXT" ] || { echo "demo: no text found (expected /usr/share/common-licenses/GPL-3)" >&2; exit 1; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
echo "[demo] training gpt2-tiny with ZeRO stage 2 on 2 ranks over $(wc -c < "$TEXT") bytes of English text"
exec "$BUILD/zerotrain" launch -n 2 -- "$BUILD/zerotrain" train \
  --config configs/demo_zero2.json --model gpt2-tiny --data "$TEXT" \
  --seq 64 --steps "${ZT_DEMO_STEPS:-300}" --print-every 25 --metrics "$BUILD/demo_metrics.jsonl"
