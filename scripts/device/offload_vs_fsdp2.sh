#!/usr/bin/env bash
# Device run OFFLOAD_VS_FSDP2 (2 GPUs): ZeRO-Offload. GPT-2 Large, bf16, micro-batch 8, seq 1024:
# zerotrain stage 2 and stage 3 with offload_optimizer cpu (pinned, CPU Adam), next to
# PyTorch FSDP2 + CPUOffloadPolicy in the same run. Results: $OUT/off_results.tar.gz.
set -uo pipefail
source scripts/device/common.sh off zerotrain_cli
cat $R/device.txt; nproc >> $R/device.txt
STEPS=${STEPS:-10}
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps $STEPS --warmup 3"
for c in ${CONFIGS:-z2_offload z3_offload}; do
  timeout 240 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_$c.json $A --metrics $R/metrics_$c.jsonl --summary $R/zt_$c.jsonl > $R/log_$c.txt 2>&1
  grep -E "offload|ms/iteration|Error|error" $R/log_$c.txt | tail -3
done
FA="--model gpt2-large --seq 1024 --micro-batch 8 --steps ${FSTEPS:-6} --warmup 2"
[ -n "${SKIP_ANCHOR:-}" ] || timeout 240 torchrun --standalone --nproc_per_node 2 bench/anchors/train_anchor.py --mode fsdp2_offload $FA --dtype bf16 --json $R/torch.jsonl > $R/log_fsdp2_offload.txt 2>&1 || tail -5 $R/log_fsdp2_offload.txt
echo "total: $(( $(date +%s) - T0 )) s"
tar -czf $OUT/off_results.tar.gz -C $OUT off
python3 - $R <<'PY'
import json, sys, glob
R = sys.argv[1]
for f in sorted(glob.glob(R + "/zt_*.jsonl")) + [R + "/torch.jsonl"]:
    try: lines = open(f).readlines()
    except FileNotFoundError: continue
    for l in lines:
        d = json.loads(l)
        name = f.split("/")[-1][:-6] if d.get("framework") == "zerotrain" else d.get("mode")
        pm = d.get("phase_mem_gib", {})
        print("%-16s ms/it %8.1f tok/s %8.0f peak %6.2f GiB | fwd %.1f bwd %.1f step %.1f ms | %s" % (
            name, d.get("ms_per_iter", 0), d.get("tokens_per_s", 0), d.get("peak_gib") or 0,
            d["phase_ms"]["forward"], d["phase_ms"]["backward"], d["phase_ms"]["step"], json.dumps(pm)))
PY
