#!/usr/bin/env bash
# Device run ZERO3_OFFLOAD_PARAM_CRASH (2 GPUs): where ZeRO-3 with offload_param fails on rank 1.
# A: gpt2 (124M) 2 GPUs with CUDA_LAUNCH_BLOCKING=1; B: gpt2-large on one GPU (cuda:1);
# C: gpt2-large 2 GPUs with CUDA_LAUNCH_BLOCKING=1; D: compute-sanitizer on gpt2-tiny.
set -uo pipefail
source scripts/device/common.sh dbg zerotrain_cli zt_gpu
timeout 100 $Z launch -n 2 -- $B/zt_gpu --gtest_filter='*EngineAsync*' > $R/gpu_async.txt 2>&1; echo "engine async rc=$?"; grep -E "^\[rank .\] \[  (PASSED|FAILED) " $R/gpu_async.txt | head
C=bench/configs/gpt2_bf16_z3_offload_param.json
A="--seq 1024 --micro-batch 8 --steps 3 --warmup 1"
run() { local name=$1; shift; timeout 150 "$@" > $R/$name.txt 2>&1; echo "== $name rc=$?"; grep -m4 -E "illegal|Exception raised from|error:|ms/iteration" $R/$name.txt | cut -c1-300; }
run A env CUDA_LAUNCH_BLOCKING=1 $Z launch -n 2 -- $Z train --config $C --model gpt2 $A
run B env CUDA_VISIBLE_DEVICES=1 $Z train --config $C --model gpt2-large $A
run C env CUDA_LAUNCH_BLOCKING=1 $Z launch -n 2 -- $Z train --config $C --model gpt2-large $A
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[ -x "$CS" ] && run D $Z launch -n 2 -- $CS --print-limit 3 --show-backtrace device $Z train --config $C --model gpt2-tiny --seq 64 --micro-batch 2 --steps 2 --warmup 1
[ -f $R/D.txt ] && grep -m12 -E "Invalid|at 0x|by thread|Address|====.*(Saved|Host Frame)" $R/D.txt | cut -c1-250
tar -czf $OUT/dbg.tar.gz -C $OUT dbg
echo "total: $(( $(date +%s) - T0 )) s"
