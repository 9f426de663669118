#!/usr/bin/env bash
# Device run ZERO012_VS_PYTORCH (2 GPUs): GPT-2 Large, bf16, micro-batch 8, seq 1024: zerotrain ZeRO 0/1/2
# next to PyTorch DDP, ZeroRedundancyOptimizer and FSDP2 (no reshard), same run.
set -uo pipefail
source scripts/device/common.sh zero012_vs_pytorch zerotrain_cli
STEPS=${STEPS:-12}
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps $STEPS --warmup 3"
for s in 0 1 2; do
  timeout 170 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z$s.json $A --metrics $R/metrics_z$s.jsonl --summary $R/zt.jsonl > $R/log_z$s.txt 2>&1
  grep -E "ms/iteration|model states per|Error|error" $R/log_z$s.txt | head -4
done
for m in ddp zero1 fsdp2; do
  timeout 170 torchrun --standalone --nproc_per_node 2 bench/anchors/train_anchor.py --mode $m $A --dtype bf16 --json $R/torch.jsonl > $R/log_$m.txt 2>&1 || tail -5 $R/log_$m.txt
done
python3 - <<PY
import json
rows=[json.loads(l) for f in ["$R/zt.jsonl","$R/torch.jsonl"] for l in open(f)]
for d in rows:
    name = "zerotrain-z%s"%d["stage"] if d.get("framework")=="zerotrain" else d.get("mode")
    pm=d.get("phase_mem_gib",{})
    print("%-14s ms/it %7.1f tok/s %7.0f mfu %.3f peak %.2f GiB | fwd %.1f bwd %.1f step %.1f ms" % (name, d.get("ms_per_iter",0), d.get("tokens_per_s",0), d.get("mfu",0), d.get("peak_gib") or 0, d["phase_ms"]["forward"], d["phase_ms"]["backward"], d["phase_ms"]["step"]))
PY
