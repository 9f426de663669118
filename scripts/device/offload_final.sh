#!/usr/bin/env bash
# Device run OFFLOAD_FINAL (2 GPUs): the GPU tests, the offload rows of the sweep with their
# PyTorch counterparts in the same call (GPT-2 Large, bf16, micro-batch 8, seq 1024:
# z2-bf16 vs FSDP2, z2-offopt / z2-offdpu / z3-offopt / z3-offall vs FSDP2 + CPUOffloadPolicy),
# then ZeRO-Infinity with optimizer AND parameters on the disk (gpt2 124M, stage 3) next to
# the same run with CPU offload. Results: $OUT/offload_final.tar.gz.
set -uo pipefail
source scripts/device/common.sh offload_final zerotrain_cli zt_gpu
timeout 150 $Z launch -n 2 -- $B/zt_gpu > $R/gpu_tests.txt 2>&1; echo "zt_gpu rc=$?"
grep -E "^\[rank 0\] \[  (PASSED|FAILED) " $R/gpu_tests.txt | head -5
$Z bench --model gpt2-large --gpus 2 --steps ${STEPS:-15} --warmup 3 --with-anchors --timeout 200 \
  --only ${ONLY:-z2-bf16,z2-offopt,z2-offdpu,z3-offopt,z3-offall} --out $R/gpt2-large > $R/bench.log 2>&1
grep "^\[bench\]" $R/bench.log | cut -c1-150
# ZeRO-Infinity, parameters too: both swap files on the machine's disk.
N=$PWD/zt_nvme; mkdir -p $N; df -T $N > $R/disk.txt
python3 - $N $R <<'PY'
import json, sys
n, r = sys.argv[1], sys.argv[2]
c = json.load(open("bench/configs/gpt2_bf16_z3_offload_param.json"))
c["zero_optimization"]["sub_group_size"] = 2e7
json.dump(c, open(r + "/z3_cpu_all.json", "w"), indent=1)
c["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": n, "pin_memory": True, "buffer_count": 4}
c["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": n, "pin_memory": True, "buffer_count": 5}
json.dump(c, open(r + "/z3_nvme_all.json", "w"), indent=1)
PY
for c in z3_cpu_all z3_nvme_all; do
  timeout 200 $Z launch -n 2 -- $Z train --config $R/$c.json --model gpt2 --seq 1024 --micro-batch 8 --steps ${NSTEPS:-6} --warmup 1 \
    --summary $R/$c.summary.jsonl --metrics $R/$c.metrics.jsonl > $R/log_$c.txt 2>&1
  echo "$c rc=$?"; grep -E "offload_param nvme|ms/iteration|rror" $R/log_$c.txt | head -4 | cut -c1-230
done
python3 - $R <<'PY'
import json, sys
r = sys.argv[1]
for c in ("z3_cpu_all", "z3_nvme_all"):
    try: rows = [json.loads(l) for l in open(f"{r}/{c}.metrics.jsonl")]
    except FileNotFoundError: continue
    print(c, "losses", [round(x["loss"], 6) for x in rows if "loss" in x][:8])
PY
rm -rf $N
tar -czf $OUT/offload_final.tar.gz -C $OUT offload_final
echo "total: $(( $(date +%s) - T0 )) s"
