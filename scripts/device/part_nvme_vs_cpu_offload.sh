# Sourced by the device scripts (after common.sh: $R, $Z): ZeRO-Infinity with optimizer AND
# parameters on the machine's disk (gpt2 124M, stage 3, 2 GPUs, NSTEPS steps) next to the
# same run with CPU offload; prints each run's lines and both loss curves, then removes the
# swap directory.
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
  echo "$c rc=$?"; grep -E "offload_param nvme|model states|ms/iteration|rror" $R/log_$c.txt | head -5 | cut -c1-260
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
