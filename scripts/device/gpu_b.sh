#!/usr/bin/env bash
# Device run B (2 GPUs): GPT-2 Large, bf16, micro-batch 8, seq 1024: zerotrain ZeRO 0/1/2
# next to PyTorch DDP, ZeroRedundancyOptimizer and FSDP2 (no reshard), same run.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; B=build-gpu; Z=$B/zerotrain
[ -x $Z ] || { cmake -S . -B $B -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF >/dev/null && ninja -C $B zerotrain_cli >/dev/null; }
STEPS=${STEPS:-12}
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps $STEPS --warmup 3"
for s in 0 1 2; do
  timeout 170 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z$s.json $A --metrics $OUT/metrics_z$s.jsonl --summary $OUT/zt.jsonl > $OUT/log_z$s.txt 2>&1
  grep -E "ms/iteration|model states per|Error|error" $OUT/log_z$s.txt | head -4
done
for m in ddp zero1 fsdp2; do
  timeout 170 torchrun --standalone --nproc_per_node 2 bench/anchors/train_anchor.py --mode $m $A --dtype bf16 --json $OUT/torch.jsonl > $OUT/log_$m.txt 2>&1 || tail -5 $OUT/log_$m.txt
done
python3 - <<PY
import json
rows=[json.loads(l) for f in ["$OUT/zt.jsonl","$OUT/torch.jsonl"] for l in open(f)]
for d in rows:
    name = "zerotrain-z%s"%d["stage"] if d.get("framework")=="zerotrain" else d.get("mode")
    pm=d.get("phase_mem_gib",{})
    print("%-14s ms/it %7.1f tok/s %7.0f mfu %.3f peak %.2f GiB | fwd %.1f bwd %.1f step %.1f ms" % (name, d.get("ms_per_iter",0), d.get("tokens_per_s",0), d.get("mfu",0), d.get("peak_gib") or 0, d["phase_ms"]["forward"], d["phase_ms"]["backward"], d["phase_ms"]["step"]))
PY
