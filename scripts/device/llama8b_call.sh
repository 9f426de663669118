#!/usr/bin/env bash
# One device call of issue 24's Llama-3-8B runs after a change (a wrapper of llama8b_2gpu.sh):
# builds zerotrain_cli and zt_gpu once, runs the zt_gpu tests named by GPU_FILTER (1 rank),
# then each phase of llama8b_2gpu.sh named in PHASES with the knobs given, and packs each
# phase's folder into $OUT/llama8b_p<N>.tar.gz (the device returns a few files only).
# Example: PHASES="1 2 3" P1="SKIP_ANCHORS=1" P2="SKIP_ANCHORS=1" bash scripts/device/llama8b_call.sh
# Phases 4 and 5 (issue 21: QLoRA and bf16 LoRA on one GPU) use GPU 0 only.
set -uo pipefail
# QBUILD=N: first times building a random QLoRA Llama-3-8B base with N layers on the host,
# whole vs layer by layer (bench_qlora_build; JSON lines in $OUT/qlora_build.json).
source scripts/device/common.sh llama8b_build zerotrain_cli ${GPU_FILTER:+zt_gpu} ${QBUILD:+bench_qlora_build}
if [ -n "${QBUILD:-}" ]; then
  timeout 400 $B/bench_qlora_build --model llama3-8b --layers $QBUILD --mode both > $OUT/qlora_build.json 2>&1
  echo "bench_qlora_build rc=$?"; cat $OUT/qlora_build.json
fi
if [ -n "${GPU_FILTER:-}" ]; then
  timeout 120 $B/zt_gpu --gtest_filter="$GPU_FILTER" > $OUT/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED" $OUT/zt_gpu.txt | sort -u | head -8
fi
for p in ${PHASES:-1}; do
  v=P$p; env PHASE=$p ${!v:-} bash scripts/device/llama8b_2gpu.sh
  tar -czf $OUT/llama8b_p$p.tar.gz -C $OUT llama8b_p$p && rm -rf $OUT/llama8b_p$p
done
rm -rf $OUT/llama8b_build
