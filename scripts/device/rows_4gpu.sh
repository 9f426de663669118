#!/usr/bin/env bash
# Device run ROWS_4GPU (4 GPUs, one call, ~9-10 min): this session's rows side by side after one
# build of this tree (zerotrain_cli, zt_gpu, example_cifar10) and one of the baseline
# (.base/base.tar.gz = `git archive BASE`, zerotrain_cli), both in the same call:
#   GPUs 0-1  cifar_moe_2gpu.sh (issue 27: the CIFAR-10 MoE tutorial row next to DeepSpeed's),
#             then zt_gpu at 2 ranks (GPU_FILTER, default all), then in parallel
#             GPU 0: Llama-3-8B QLoRA (issue 21): this tree, the baseline, then transformers +
#                    peft + bitsandbytes (llama_dist_anchor.py --mode single --lora 16 --qlora)
#             GPU 1: the same with bf16 LoRA (anchor: transformers + peft)
#             (seq 2048, mb 1, activation checkpointing, r 16 on the seven projections;
#             ZT_EXTRA: more flags for this tree's runs)
#   GPUs 2-3  moe_mixtral_2gpu.sh (issue 27: the Mixtral row next to DeepSpeed-MoE), then
#             GPU 2: Llama-3.2-1B full training (bf16, mb 4, seq 2048, ZeRO-0): baseline / this
#                    tree alternately, ROUNDS_1B rounds (issue 17)
#             GPU 3: GPT-2 Large `bench --only z0-bf16` and `z3-bf16`: baseline / this tree (the
#                    engine's speed rows, as speed_ab_1gpu.sh)
# The jobs share the host (64 cores); each comparison is taken under the same load on both
# sides, in alternation. Every job packs its own results as it finishes
# ($OUT/cifar_moe_2gpu.tar.gz, $OUT/moe_mixtral_2gpu.tar.gz, $OUT/rows.tar.gz); tables printed last.
# Carry .head (git archive HEAD), .base, .whl (or .whl-ds linked as .whl) and .whl-bnb.
set -uo pipefail
mkdir -p /tmp/base && tar -xzf .base/base.tar.gz -C /tmp/base || exit 1
( cd /tmp/base && cmake -S . -B build-gpu -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > /tmp/base_cmake.log 2>&1 \
  && ninja -C build-gpu zerotrain_cli > /tmp/base_build.log 2>&1; echo "baseline build rc=$?" ) &
source scripts/device/common.sh rows zerotrain_cli zt_gpu example_cifar10 || exit 1
wait
ZB=/tmp/base/build-gpu/zerotrain
[ -x $ZB ] || { tail -20 /tmp/base_build.log; exit 1; }
echo "both built: $(( $(date +%s) - T0 )) s"
# Watchdog: at DEADLINE s after the start (default 555) whatever still runs is stopped, so the
# tables and tarballs are written inside the call's 600 s.
( sleep $(( ${DEADLINE:-540} - ($(date +%s) - T0) )); echo "watchdog: stopping the runs left"
  pkill -f "zerotrain|zt_gpu|torchrun|llama_dist_anchor|ds_moe_anchor|ds_cifar_moe_anchor|example_cifar10" ) &
WATCHDOG=$!
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_lora \
  .whl/*.whl .whl-bnb/*.whl || echo "anchor wheels: install failed"
LORA="r=16,alpha=32,targets=q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj"
ZF="--config bench/configs/llama_bf16_z0.json --model llama3-8b --seq 2048 --micro-batch 1 --checkpoint-activations
  --steps 6 --warmup 3 --device cuda --print-every 1"
lora_rows() {  # GPU KIND(qlora|lora)
  local g=$1 k=$2 d=$R/$2 zl="--lora $LORA" al="--lora 16"; mkdir -p $d
  [ $k = qlora ] && zl="$zl --qlora" && al="$al --qlora"
  CUDA_VISIBLE_DEVICES=$g timeout 150 $Z launch -n 1 -- $Z train $ZF $zl ${ZT_EXTRA:-} --summary $d/1_new.json > $d/1_new.log 2>&1
  echo "$k new rc=$?"
  CUDA_VISIBLE_DEVICES=$g timeout 150 $ZB launch -n 1 -- $ZB train $ZF $zl --summary $d/2_base.json > $d/2_base.log 2>&1
  echo "$k base rc=$?"
  CUDA_VISIBLE_DEVICES=$g PYTHONPATH=/tmp/site_lora timeout 200 torchrun --standalone --nproc_per_node 1 \
    bench/anchors/llama_dist_anchor.py --mode single --model llama3-8b --seq 2048 --micro-batch 1 \
    --checkpoint-activations --steps 3 --warmup 3 $al > $d/3_anchor.json 2> $d/3_anchor.log
  echo "$k anchor rc=$?"
  python3 scripts/device/llama8b_table.py $d > $d/table.md 2>&1
}
ab_1b() {  # GPU: Llama-3.2-1B full training, baseline and this tree alternately
  local d=$R/llama1b; mkdir -p $d
  for r in $(seq 1 ${ROUNDS_1B:-2}); do
    for v in base new; do
      local Zv=$Z; [ $v = base ] && Zv=$ZB
      CUDA_VISIBLE_DEVICES=$1 timeout 120 $Zv train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b \
        --seq 2048 --micro-batch 4 --steps 15 --warmup 3 --device cuda --summary $d/$v-r$r.json > $d/$v-r$r.log 2>&1
      echo "1b $v r$r rc=$?"
    done
  done
}
ab_gpt2() {  # GPU: GPT-2 Large bench rows, baseline and this tree alternately
  local d=$R/gpt2; mkdir -p $d
  for c in ${GPT2_ONLY:-z0-bf16 z3-bf16}; do
    for v in base new; do
      local Zv=$Z; [ $v = base ] && Zv=$ZB
      CUDA_VISIBLE_DEVICES=$1 $Zv bench --model gpt2-large --gpus 1 --steps 15 --warmup 3 --only $c --timeout 150 \
        --out $d/$v-r1-$c > $d/$v-r1-$c.log 2>&1
      grep "^\[bench\] $c" $d/$v-r1-$c.log | cut -c1-120 | sed "s/^/$v /"
    done
  done
}
( export CUDA_VISIBLE_DEVICES=0,1
  SITE=/tmp/site_cf PET_MASTER_PORT=29810 bash scripts/device/cifar_moe_2gpu.sh > $OUT/job_cifar.txt 2>&1
  timeout 150 $Z launch -n 2 -- $B/zt_gpu ${GPU_FILTER:+--gtest_filter=$GPU_FILTER} > $R/zt_gpu.txt 2>&1; echo "zt_gpu rc=$?"
  lora_rows 0 qlora > $R/job_qlora.txt 2>&1 &
  lora_rows 1 lora > $R/job_lora.txt 2>&1 &
  wait ) > $R/job_a.txt 2>&1 &
JOB_A=$!
( CUDA_VISIBLE_DEVICES=2,3 SITE=/tmp/site_mx PET_MASTER_PORT=29710 ZT_BIN=$Z STAGES=${MX_STAGES:-2 3} \
    bash scripts/device/moe_mixtral_2gpu.sh > $OUT/job_mixtral.txt 2>&1
  ab_1b 2 > $R/job_1b.txt 2>&1 &
  ab_gpt2 3 > $R/job_gpt2.txt 2>&1 &
  wait ) > $R/job_b.txt 2>&1 &
JOB_B=$!
wait $JOB_A $JOB_B
kill $WATCHDOG 2>/dev/null
python3 - "$R" <<'PY' > $R/ab.md 2>&1
import json, os, statistics, sys
R = sys.argv[1]
d = f"{R}/llama1b"
for v in ("base", "new"):
    ms = []
    for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if f.startswith(v) and f.endswith(".json"):
            try: ms.append(json.loads(open(f"{d}/{f}").read().splitlines()[-1])["ms_per_iter"])
            except Exception: pass
    print(f"llama3.2-1b {v}: ms/iter {ms} median {statistics.median(ms) if ms else float('nan'):.1f}")
PY
python3 scripts/device/ab_table.py $R/gpt2 >> $R/ab.md 2>&1
grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4 > $R/zt_gpu_summary.txt
grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head >> $R/zt_gpu_summary.txt
tar -czf $OUT/rows.tar.gz -C $OUT rows && rm -rf $R
for f in $OUT/job_cifar.txt $OUT/job_mixtral.txt; do echo "== $f"; tail -12 $f; done
tar -xzf $OUT/rows.tar.gz -C /tmp && cd /tmp/rows && { echo "== zt_gpu"; cat zt_gpu_summary.txt; echo "== ab"; cat ab.md
  for k in qlora lora; do echo "== $k"; cat $k/table.md 2>/dev/null | cut -c1-200; done; }
echo "total: $(( $(date +%s) - T0 )) s"
