#!/usr/bin/env bash
# Device run NVME_CAP: ZeRO-Infinity with optimizer AND parameters on the disk (gpt2 124M,
# stage 3, 2 GPUs) next to the same run with CPU offload (scripts/device/nvme_params_demo.sh),
# then the FSDP2 + CPUOffloadPolicy capacity probe on one GPU (scripts/device/cap_fsdp2.sh,
# LAYERS). Results: $OUT/*.tar.gz.
set -uo pipefail
source scripts/device/common.sh nvme_all zerotrain_cli
source scripts/device/nvme_params_demo.sh
tar -czf $OUT/nvme_all.tar.gz -C $OUT nvme_all
echo "nvme part: $(( $(date +%s) - T0 )) s"
[ -n "${LAYERS:-}" ] && bash scripts/device/cap_fsdp2.sh
echo "total: $(( $(date +%s) - T0 )) s"
