#!/usr/bin/env bash
# Device run CPU_ADAM: CPU Adam on the GPU machine's host (774M parameters, all cores) against
# torch.optim.Adam(fused=True) on the CPU, same machine, same call.
set -uo pipefail
source scripts/device/common.sh cpu_adam zerotrain_cli
N=$(nproc); lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200
timeout 240 $Z bench adam --params 774e6 --threads $N --kernel all --grad-dtype bf16 --iters 5 --json $R/adam_zt.jsonl 2>&1 | tail -15
timeout 200 python3 bench/anchors/torch_cpu_adam.py --params 774e6 --threads $N --iters 3 --json $R/adam_torch.jsonl 2>&1 | tail -5
