#!/usr/bin/env bash
# Device run TP_PP_CKPT_4GPU (4 GPUs): issue 26's "a checkpoint saved at tp 2 x pp 2 resumes at
# tp 1 x dp 4" on NCCL (the CPU-rank proof: ParallelCli.TrainTensorPipelineCheckpointLoadsAtDp4).
# gpt2 (124M), fp32, ZeRO-1, AdamW lr 1e-4, clip 1.0, micro-batch 2 x seq 256, global batch 8:
#   straight  tp 2 x pp 2 (1F1B, 4 micro-batches), 6 steps
#   first     the same, 3 steps, --save
#   resumed   dp 4 (no tp, no pipeline, accumulation 1), --load, steps 4-6, every rank's loss
# Prints steps 4-6: the straight run's loss, the resumed run's mean over its 4 ranks, the
# difference. Results: $OUT/tp_pp_ckpt.tar.gz.
set -uo pipefail
source scripts/device/common.sh tp_pp_ckpt zerotrain_cli || exit 1
cat > $R/cfg.json <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 1}}
JSON
F="train --config $R/cfg.json --model gpt2 --device cuda --warmup 1 --seq 256 --print-every 1 --data README.md"
timeout 120 $Z launch -n 4 -- $Z $F --tp 2 --pp 2 --steps 6 > $R/straight.log 2>&1; echo "straight rc=$?"
timeout 120 $Z launch -n 4 -- $Z $F --tp 2 --pp 2 --steps 3 --save $R/ckpt > $R/first.log 2>&1; echo "first rc=$?"
ZT_LOG_RANKS=all timeout 120 $Z launch -n 4 -- $Z $F --set gradient_accumulation_steps=1 --steps 6 --load $R/ckpt \
  > $R/resumed.log 2>&1; echo "resumed rc=$?"
grep -E "resuming at|error|what\(\)" $R/*.log | head -5
python3 - $R <<'PY' | tee $R/table.md
import re, sys
R = sys.argv[1]
pat = re.compile(r"(?:\[rank (\d)\] )?Epoch \d+, Step (\d)/6, Loss: ([0-9.]+)")
def losses(name, by_rank=False):
    out = {}
    for m in pat.finditer(open(f"{R}/{name}.log").read()):
        rank, step, loss = int(m.group(1) or 0), int(m.group(2)), float(m.group(3))
        out.setdefault(step, {})[rank] = loss
    return out
s, r = losses("straight"), losses("resumed")
print("| step | tp 2 x pp 2 straight | dp 4 resumed (mean of 4 ranks) | difference |")
print("|---|---|---|---|")
worst = 0.0
for step in (4, 5, 6):
    a = s.get(step, {}).get(0); b = r.get(step, {})
    if a is None or len(b) != 4:
        print(f"| {step} | {a} | ranks {sorted(b)} | missing |"); worst = float("inf"); continue
    mean = sum(b.values()) / 4; worst = max(worst, abs(mean - a))
    print(f"| {step} | {a:.6f} | {mean:.6f} | {abs(mean - a):.2e} |")
print(f"largest difference: {worst:.2e}")
PY
rm -rf $R/ckpt; tar -czf $OUT/tp_pp_ckpt.tar.gz -C $OUT tp_pp_ckpt
