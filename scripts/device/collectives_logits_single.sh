#!/usr/bin/env bash
# Device run COLLECTIVES_LOGITS_SINGLE (2 GPUs): build, GPU tests, collective bench vs torch.distributed,
# logits vs transformers, single-GPU speed vs transformers, activation checkpointing.
set -uo pipefail
source scripts/device/common.sh collectives_logits_single zerotrain_cli zt_gpu bench_collectives gpt2_logits
cat $R/device.txt
timeout 120 $Z launch -n 2 -- $B/zt_gpu 2>&1 | tail -8 | tee $R/gpu_tests.txt
timeout 120 $Z launch -n 2 -- $B/bench_collectives --min 1M --max 1G --factor 4 --dtype bf16 --ops reduce_scatter,all_gather --json $R/coll_zt.jsonl > $R/coll_zt.txt 2>&1; tail -12 $R/coll_zt.txt
timeout 120 torchrun --standalone --nproc_per_node 2 bench/anchors/collectives.py --json $R/coll_torch.jsonl > $R/coll_torch.txt 2>&1; tail -12 $R/coll_torch.txt
timeout 120 python3 bench/anchors/hf_gpt2_compare.py --bin $B/gpt2_logits > $R/logits.txt 2>&1; tail -6 $R/logits.txt
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps 10 --warmup 3"
CUDA_VISIBLE_DEVICES=0 timeout 150 $Z launch -n 1 -- $Z train --config bench/configs/gpt2_bf16_z0.json $A --summary $R/single_zt.jsonl > $R/single_zt.txt 2>&1; tail -12 $R/single_zt.txt
CUDA_VISIBLE_DEVICES=0 timeout 150 $Z launch -n 1 -- $Z train --config bench/configs/gpt2_bf16_z0.json $A --checkpoint-activations --summary $R/single_zt.jsonl > $R/single_zt_ckpt.txt 2>&1; tail -5 $R/single_zt_ckpt.txt
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 bench/anchors/train_anchor.py --mode hf $A --dtype bf16 --json $R/single_torch.jsonl > $R/single_hf.txt 2>&1; tail -3 $R/single_hf.txt
echo "total: $(( $(date +%s) - T0 )) s"
python3 - <<PY
import json,glob
for f in ["$R/single_zt.jsonl","$R/single_torch.jsonl"]:
    try:
        for l in open(f): d=json.loads(l); print(f.split('/')[-1], d.get('mode',''), d.get('activation_checkpointing',''), 'ms/it %.1f'%d.get('ms_per_iter',0), 'tok/s %.0f'%d.get('tokens_per_s',0), 'mfu %.3f'%d.get('mfu',0), 'peak %.2f GiB'%d.get('peak_gib',0))
    except Exception as e: print(f, e)
PY
