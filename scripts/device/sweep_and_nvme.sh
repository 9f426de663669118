#!/usr/bin/env bash
# Device run SWEEP_AND_NVME (2 GPUs): the whole `zerotrain bench` sweep with PyTorch anchors on
# GPT-2 Large (as scripts/device/sweep.sh), then ZeRO-2 with offload_optimizer nvme on the
# machine's disk. Results: $OUT/final_results.tar.gz.
set -uo pipefail
COMMIT=${COMMIT:?pass COMMIT=<sha> (the device copy has no current git HEAD)}
source scripts/device/common.sh final zerotrain_cli
cat $R/device.txt
t1=$(date +%s)
[ -n "${SKIP_SWEEP:-}" ] || $Z bench --model gpt2-large --gpus 2 --steps ${STEPS:-20} --warmup 2 --with-anchors --python python3 \
  --timeout 150 --commit $COMMIT --out $R/gpt2-large > $R/bench.log 2>&1
echo "sweep + anchors: $(( $(date +%s) - t1 )) s"
# NVMe: the swap files on this machine's disk (SKIP_NVME=1 leaves it out).
if [ -z "${SKIP_NVME:-}" ]; then
N=$PWD/zt_nvme; mkdir -p $N; df -T $N | tee $R/disk.txt; free -g | head -2 >> $R/disk.txt
python3 - $N $R/z2_nvme.json <<'PY'
import json, sys
c = json.load(open("bench/configs/gpt2_bf16_z2_offload.json"))
c["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": sys.argv[1], "pin_memory": True, "buffer_count": 4}
c["aio"] = {"block_size": 1048576, "queue_depth": 16}
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY
timeout 200 $Z launch -n 2 -- $Z train --config $R/z2_nvme.json --model gpt2-large --seq 1024 --micro-batch 8 --steps ${NSTEPS:-6} --warmup 2 \
  --summary $R/z2_nvme.summary.jsonl --metrics $R/z2_nvme.metrics.jsonl > $R/log_z2_nvme.txt 2>&1
echo "nvme rc=$?"; grep -E "nvme|ms/iteration|error" $R/log_z2_nvme.txt | head -12 | cut -c1-220
fi
echo "total: $(( $(date +%s) - T0 )) s"
tar -czf $OUT/final_results.tar.gz -C $OUT final
grep "^\[bench\]" $R/bench.log | cut -c1-150
