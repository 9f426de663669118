#!/usr/bin/env bash
# Device run A (2 GPUs): build, GPU tests, collective bench vs torch.distributed,
# logits vs transformers, single-GPU speed vs transformers, activation checkpointing.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; B=build-gpu
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $OUT/device.txt
t0=$(date +%s)
if [ ! -f $B/build.ninja ]; then cmake -S . -B $B -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > $OUT/cmake.log 2>&1 || { tail -30 $OUT/cmake.log; exit 1; }; fi
ninja -C $B zerotrain_cli zt_gpu bench_collectives gpt2_logits > $OUT/build.log 2>&1 || { grep -E "error" $OUT/build.log | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
Z=$B/zerotrain
timeout 120 $Z launch -n 2 -- $B/zt_gpu 2>&1 | tail -8 | tee $OUT/gpu_tests.txt
timeout 120 $Z launch -n 2 -- $B/bench_collectives --min 1M --max 1G --factor 4 --dtype bf16 --ops reduce_scatter,all_gather --json $OUT/coll_zt.jsonl > $OUT/coll_zt.txt 2>&1; tail -12 $OUT/coll_zt.txt
timeout 120 torchrun --standalone --nproc_per_node 2 bench/anchors/collectives.py --json $OUT/coll_torch.jsonl > $OUT/coll_torch.txt 2>&1; tail -12 $OUT/coll_torch.txt
timeout 120 python3 bench/anchors/hf_gpt2_compare.py --bin $B/gpt2_logits > $OUT/logits.txt 2>&1; tail -6 $OUT/logits.txt
A="--model gpt2-large --seq 1024 --micro-batch 8 --steps 10 --warmup 3"
CUDA_VISIBLE_DEVICES=0 timeout 150 $Z launch -n 1 -- $Z train --config bench/configs/gpt2_bf16_z0.json $A --summary $OUT/single_zt.jsonl > $OUT/single_zt.txt 2>&1; tail -12 $OUT/single_zt.txt
CUDA_VISIBLE_DEVICES=0 timeout 150 $Z launch -n 1 -- $Z train --config bench/configs/gpt2_bf16_z0.json $A --checkpoint-activations --summary $OUT/single_zt.jsonl > $OUT/single_zt_ckpt.txt 2>&1; tail -5 $OUT/single_zt_ckpt.txt
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 bench/anchors/train_anchor.py --mode hf $A --dtype bf16 --json $OUT/single_torch.jsonl > $OUT/single_hf.txt 2>&1; tail -3 $OUT/single_hf.txt
echo "total: $(( $(date +%s) - t0 )) s"
python3 - <<PY
import json,glob
for f in ["$OUT/single_zt.jsonl","$OUT/single_torch.jsonl"]:
    try:
        for l in open(f): d=json.loads(l); print(f.split('/')[-1], d.get('mode',''), d.get('activation_checkpointing',''), 'ms/it %.1f'%d.get('ms_per_iter',0), 'tok/s %.0f'%d.get('tokens_per_s',0), 'mfu %.3f'%d.get('mfu',0), 'peak %.2f GiB'%d.get('peak_gib',0))
    except Exception as e: print(f, e)
PY
