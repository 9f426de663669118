#!/usr/bin/env bash
# Device run FINAL_17_24_25_4GPU (4 GPUs of one host, one call, ~7-8 min from cold): the checks
# of one change for issues 17, 24 and 25, after building this tree (zerotrain_cli, zt_gpu), the
# baseline .base/base.tar.gz (issue 17's A/B: the session's starting commit) and, when
# .base24/base.tar.gz is carried, issue 24's baseline (the commit before the engine split), all
# three at once:
#   1. GPUs 0-3  issue 25: GPT-2 XL, pp 2 x dp 2, interleaved 1F1B (v 2), ZeRO-2, bf16, mb 4 x
#                1024, 8 micro-batches, PIPE_STEPS steps (default 6), with the defaults (no
#                ZT_PIPE_* variables: the eager pipeline groups on), under a 90 s timeout
#   2. at once:
#      GPUs 0-1  zt_gpu at 2 ranks (GPU_FILTER, default all), then issue 24's CPU-offload rows
#                (OFF_ROWS, default z2-offopt z3-offopt) of `zerotrain bench --model gpt2-large
#                --gpus 2` alternately baseline / this tree, OFF_ROUNDS rounds (default 3), each
#                started only when it can end before DEADLINE
#      GPU 2     issue 17: the Llama-3.2-1B row (llama_bf16_z0.json, mb 4, seq 2048, 15 steps
#                after 3) base, new, new, base
#      GPU 3     the same row new, base, base, new (a crossover: each GPU runs both trees)
# DEADLINE (default 450 s from the start, build included): nothing starts that could end
# after it. Results: $OUT/final.tar.gz; the tables last (ab_table.py per part).
set -uo pipefail
DEADLINE=${DEADLINE:-450}
mkdir -p /tmp/base && tar -xzf .base/base.tar.gz -C /tmp/base || exit 1
( cd /tmp/base && cmake -S . -B build-gpu -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > /tmp/base_cmake.log 2>&1 \
  && ninja -C build-gpu zerotrain_cli > /tmp/base_build.log 2>&1; echo "baseline (17) build rc=$?" ) &
if [ -f .base24/base.tar.gz ]; then
  mkdir -p /tmp/base24 && tar -xzf .base24/base.tar.gz -C /tmp/base24 || exit 1
  ( cd /tmp/base24 && cmake -S . -B build-gpu -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > /tmp/base24_cmake.log 2>&1 \
    && ninja -C build-gpu zerotrain_cli > /tmp/base24_build.log 2>&1; echo "baseline (24) build rc=$?" ) &
fi
source scripts/device/common.sh final zerotrain_cli zt_gpu || exit 1
wait
echo "all built: $(( $(date +%s) - T0 )) s"
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }

# 1. issue 25
cat > $R/pipe_cfg.json <<JSON
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8, "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "zero_optimization": {"stage": 2, "overlap_comm": true, "reduce_bucket_size": 500000000},
 "pipeline": {"stages": 2, "schedule": "interleaved", "virtual_stages": 2}}
JSON
env -u ZT_PIPE_EAGER_COMMS -u ZT_PIPE_ALLOW_INTERLEAVED_ZERO2 timeout -k 5 90 $Z launch -n 4 -- $Z train \
  --config $R/pipe_cfg.json --model gpt2-xl --pp 2 --seq 1024 --steps ${PIPE_STEPS:-6} --data random --print-every 1 \
  > $R/pipe_xl.log 2>&1
echo "pipe xl interleaved zero-2 (defaults) rc=$?"; grep -E "Step [0-9]+/|error|Error|refused" $R/pipe_xl.log | cut -c1-200 | tail -7

# 2. side by side
ab1b() {  # gpu, order...
  local g=$1; shift; local i=0
  for v in "$@"; do
    i=$((i + 1)); [ $(left) -gt 40 ] || { echo "1B $v on GPU $g: skipped (deadline)"; continue; }
    local Zv=$Z; [ $v = base ] && Zv=/tmp/base/build-gpu/zerotrain
    CUDA_VISIBLE_DEVICES=$g timeout 60 $Zv train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 \
      --micro-batch 4 --steps 18 --warmup 3 --device cuda --summary $R/l1b-g$g-$i-$v.json > $R/l1b-g$g-$i-$v.log 2>&1
  done
}
ab1b 2 base new new base &
ab1b 3 new base base new &
mkdir -p $R/off
( export CUDA_VISIBLE_DEVICES=0,1
  timeout 120 $Z launch -n 2 -- $B/zt_gpu ${GPU_FILTER:+--gtest_filter=$GPU_FILTER} > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?" > $R/zt_gpu.rc
  if [ -x /tmp/base24/build-gpu/zerotrain ]; then
    for r in $(seq 1 ${OFF_ROUNDS:-3}); do
      for c in ${OFF_ROWS:-z2-offopt z3-offopt}; do
        for v in base new; do
          [ $(left) -gt 45 ] || continue
          Zv=$Z; [ $v = base ] && Zv=/tmp/base24/build-gpu/zerotrain
          timeout $(( $(left) - 5 )) $Zv bench --model gpt2-large --gpus 2 --steps 15 --warmup 3 --python python3 --timeout 90 \
            --only $c --out $R/off/$v-r$r-$c > $R/off-$v-r$r-$c.log 2>&1
        done
      done
    done
  fi ) &
wait
cat $R/zt_gpu.rc; grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4; grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
python3 - $R <<'PY'
import glob, json, os, statistics, sys
R = sys.argv[1]; d = {}
for f in sorted(glob.glob(f"{R}/l1b-*.json")):
    j = json.load(open(f)); v = f.rsplit("-", 1)[1][:-5]
    d.setdefault(v, []).append((j["ms_per_iter"], j.get("mfu", 0), j["peak_gib"], os.path.basename(f)))
print("| Llama-3.2-1B, bf16, mb 4, seq 2048 | runs (ms/iter) | median ms | MFU | peak GiB |")
print("|---|---|---|---|---|")
for v in ("base", "new"):
    if v in d:
        ms = [x[0] for x in d[v]]
        print(f"| {v} | {', '.join(f'{x:.1f}' for x in ms)} | {statistics.median(ms):.1f} | {statistics.median(x[1] for x in d[v]) * 100:.1f}% | {d[v][0][2]:.2f} |")
if "base" in d and "new" in d:
    print(f"new / base: {statistics.median(x[0] for x in d['new']) / statistics.median(x[0] for x in d['base']):.3f}")
json.dump(d, open(f"{R}/llama1b_ab.json", "w"), indent=1)
PY
[ -d $R/off ] && python3 scripts/device/ab_table.py $R/off
tar -czf $OUT/final.tar.gz -C $OUT final
echo "total: $(( $(date +%s) - T0 )) s"
