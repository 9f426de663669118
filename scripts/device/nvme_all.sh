#!/usr/bin/env bash
# Device run NVME_ALL: ZeRO-Infinity with optimizer AND parameters on the disk (gpt2 124M,
# stage 3, 2 GPUs) next to the same run with CPU offload (scripts/device/part_nvme_vs_cpu_offload.sh),
# then the FSDP2 + CPUOffloadPolicy capacity probe on one GPU (scripts/device/capacity_fsdp2.sh,
# LAYERS). Results: $OUT/*.tar.gz.
set -uo pipefail
source scripts/device/common.sh nvme_all zerotrain_cli
source scripts/device/part_nvme_vs_cpu_offload.sh
tar -czf $OUT/nvme_all.tar.gz -C $OUT nvme_all
echo "nvme part: $(( $(date +%s) - T0 )) s"
[ -n "${LAYERS:-}" ] && bash scripts/device/capacity_fsdp2.sh
echo "total: $(( $(date +%s) - T0 )) s"
