#!/usr/bin/env bash
# Device run CAP (1 GPU of the 2-GPU host, 256 GB host memory): the largest GPT-2-shaped
# model (width 4096, 32 heads, micro-batch 1, seq 1024, checkpointing) that trains on ONE
# GPU without offload (ZeRO-3 at world 1) and with CPU offload of optimizer + parameters.
# Usage: LAYERS_NO="44 48" LAYERS_OFF="59" bash scripts/device/gpu_cap.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 CUDA_VISIBLE_DEVICES=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=${OUT:-/tmp/out}; R=$OUT/cap; mkdir -p $R; B=build-gpu; Z=$B/zerotrain
t0=$(date +%s)
if [ ! -f $B/build.ninja ]; then cmake -S . -B $B -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > $R/cmake.log 2>&1; fi
ninja -C $B zerotrain_cli > $R/build.log 2>&1 || { grep error $R/build.log | head; exit 1; }
free -g | head -2 | tee $R/host.txt
run() {  # name config layers
  local n=$1 c=$2 l=$3
  timeout ${T:-170} $Z launch -n 1 -- $Z train --config bench/configs/$c.json --model gpt2 --layers $l --embd 4096 --heads 32 \
    --seq 1024 --micro-batch 1 --steps 3 --warmup 1 --checkpoint-activations --summary $R/cap.jsonl > $R/log_${n}_$l.txt 2>&1
  echo "$n layers=$l rc=$? $(grep -oE 'n_params[^,]*' $R/cap.jsonl | tail -1) | $(grep -E 'ms/iteration|model states per rank|out of memory|OutOfMemory|error' $R/log_${n}_$l.txt | head -3 | tr '\n' ' ')"
}
for l in ${LAYERS_NO:-44 48}; do run nooffload cap_z3 $l; done
for l in ${LAYERS_OFF:-59}; do run offload cap_z3_offload $l; done
echo "total: $(( $(date +%s) - t0 )) s"
tar -czf $OUT/cap_results.tar.gz -C $OUT cap
