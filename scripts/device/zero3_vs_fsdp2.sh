#!/usr/bin/env bash
# Device run ZERO3_VS_FSDP2 (2 GPUs): ZeRO-3.
#  1. GPT-2 Large, bf16, micro-batch 8, seq 1024: zerotrain stage 3 (DeepSpeed's defaults,
#     and reuse distance 0 = release every block after forward) and stage 2, next to
#     PyTorch FSDP2 with reshard_after_forward=True, in the same run.
#  2. A 10.3B-parameter GPT-2 (50 x 4096) whose replicated model states (165 GB) fit on no
#     GPU: stage 3, activation checkpointing, micro-batch 1, built partitioned.
# Results: $OUT/z3_results.tar.gz; a table last.
set -uo pipefail
source scripts/device/common.sh z3 zerotrain_cli gpt2_logits zt_dist
cat $R/device.txt
STEPS=${STEPS:-12}
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps $STEPS --warmup 3"
for c in ${CONFIGS:-z3 z3_reshard}; do
  timeout 200 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_$c.json $A --metrics $R/metrics_$c.jsonl --summary $R/zt_$c.jsonl > $R/log_$c.txt 2>&1
  grep -E "ms/iteration|zero-3|Error|error" $R/log_$c.txt | tail -3
done
timeout 200 torchrun --standalone --nproc_per_node 2 bench/anchors/train_anchor.py --mode fsdp2_reshard $A --dtype bf16 --json $R/torch.jsonl > $R/log_fsdp2_reshard.txt 2>&1 || tail -5 $R/log_fsdp2_reshard.txt
# 10B, on text (byte tokens) so the loss can fall.
cat README.md docs/*.md > /tmp/zt_text.txt
timeout 420 $Z launch -n 2 -- $Z train --data /tmp/zt_text.txt --config bench/configs/gpt2_10b_bf16_z3.json --model gpt2 --layers 50 --embd 4096 --heads 32 \
  --seq 1024 --micro-batch 1 --steps ${STEPS10:-6} --warmup 2 --checkpoint-activations --metrics $R/metrics_10b.jsonl --summary $R/zt_10b.jsonl > $R/log_10b.txt 2>&1
tail -6 $R/log_10b.txt
nvidia-smi --query-gpu=memory.used --format=csv >> $R/device.txt
echo "total: $(( $(date +%s) - T0 )) s"
tar -czf $OUT/z3_results.tar.gz -C $OUT z3
python3 - $R <<'PY'
import json, sys, glob
R = sys.argv[1]
rows = []
for f in sorted(glob.glob(R + "/zt_*.jsonl")) + [R + "/torch.jsonl"]:
    try:
        for l in open(f):
            d = json.loads(l); d["_f"] = f.split("/")[-1]; rows.append(d)
    except FileNotFoundError:
        pass
for d in rows:
    name = d["_f"].replace(".jsonl", "") if d.get("framework") == "zerotrain" else d.get("mode")
    pm = d.get("phase_mem_gib", {})
    ls = d.get("last_step", {})
    extra = "exposed %.2f ms gathers %s" % (ls.get("comm", {}).get("exposed_ms", 0), ls.get("zero3", {}).get("gathers")) if ls else ""
    print("%-16s ms/it %8.1f tok/s %8.0f mfu %.3f peak %6.2f GiB | fwd %.1f bwd %.1f step %.1f ms | %s | loss %s -> %s | %s" % (
        name, d.get("ms_per_iter", 0), d.get("tokens_per_s", 0), d.get("mfu", 0) or 0, d.get("peak_gib") or 0,
        d["phase_ms"]["forward"], d["phase_ms"]["backward"], d["phase_ms"]["step"], extra,
        d.get("loss_first"), d.get("loss_last"), json.dumps(pm)))
PY
