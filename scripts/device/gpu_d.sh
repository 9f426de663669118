#!/usr/bin/env bash
# Device run D: CPU Adam on the GPU machine's host (774M parameters, all cores) against
# torch.optim.Adam(fused=True) on the CPU, same machine, same call.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; B=build-gpu; Z=$B/zerotrain
if [ ! -x $Z ]; then cmake -S . -B $B -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF >/dev/null && ninja -C $B zerotrain_cli >/dev/null || exit 1; fi
N=$(nproc); lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200
timeout 240 $Z bench adam --params 774e6 --threads $N --kernel all --grad-dtype bf16 --iters 5 --json $OUT/adam_zt.jsonl 2>&1 | tail -15
timeout 200 python3 bench/anchors/torch_cpu_adam.py --params 774e6 --threads $N --iters 3 --json $OUT/adam_torch.jsonl 2>&1 | tail -5
