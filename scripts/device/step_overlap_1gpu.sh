#!/usr/bin/env bash
# Device run STEP_OVERLAP_1GPU (one GPU; about 1 min of tests and 4 x ~40-60 s of training after
# the build): issue 17's step overlap ([Step Overlap] in src/zero/step_overlap.h).
#   1. zt_gpu --gtest_filter='*StepOverlapGpu*:*EngineAsync*:*FusedAdam*' (bit-identical weights and
#      losses with ZT_STEP_OVERLAP on and off; the asynchronous step; the Adam kernel)
#   2. the Llama-3.2-1B row (bench/configs/llama_bf16_z0.json, mb 4, seq 2048, 18 steps after 3
#      warm-up) with ZT_STEP_OVERLAP=0 and =1 alternately: off, on, on, off
# Knobs: GPU_FILTER (the zt_gpu filter), ORDER (default "off on on off"). Honours
# CUDA_VISIBLE_DEVICES (default: GPU 0). Results under $OUT/step_overlap; the table last.
set -uo pipefail
source scripts/device/common.sh step_overlap zerotrain_cli zt_gpu || exit 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES%%,*}  # one GPU

timeout 150 $B/zt_gpu --gtest_filter="${GPU_FILTER:-*StepOverlapGpu*:*EngineAsync*:*FusedAdam*}" > $R/zt_gpu.txt 2>&1
echo "zt_gpu rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran" $R/zt_gpu.txt | head -4
grep -E "FAILED  \]|Failure|error" $R/zt_gpu.txt | sort -u | head -20

i=0
for v in ${ORDER:-off on on off}; do
  i=$((i + 1)); x=0; [ $v = on ] && x=1
  ZT_STEP_OVERLAP=$x timeout 90 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 \
    --micro-batch 4 --steps 18 --warmup 3 --device cuda --summary $R/l1b-$i-$v.json > $R/l1b-$i-$v.log 2>&1
  echo "1B run $i ($v) rc=$?; $(grep -m1 -o 'step overlap: [a-z]*[^:]*' $R/l1b-$i-$v.log)"
done

python3 - $R <<'PY'
import glob, json, os, statistics, sys
R = sys.argv[1]; d = {}
for f in sorted(glob.glob(f"{R}/l1b-*.json")):
    j = json.load(open(f)); v = f.rsplit("-", 1)[1][:-5]
    last = j.get("last_step", {})
    waits = last.get("step_overlap_unit_waits", "-")
    d.setdefault(v, []).append({"ms": j["ms_per_iter"], "mfu": j.get("mfu", 0), "peak": j["peak_gib"],
                                "step_ms": j.get("phase_ms", {}).get("step", 0),
                                "fwd_ms": j.get("phase_ms", {}).get("forward", 0),
                                "loss_last": j.get("loss_last"), "waits": waits, "file": os.path.basename(f)})
print("| Llama-3.2-1B, bf16, ZeRO-0, mb 4, seq 2048 | runs (ms/iter) | median ms | MFU | peak GiB | fwd ms | step ms | unit waits | last loss |")
print("|---|---|---|---|---|---|---|---|---|")
for v in ("off", "on"):
    if v in d:
        r = d[v]; ms = [x["ms"] for x in r]
        print(f"| ZT_STEP_OVERLAP={0 if v == 'off' else 1} | {', '.join(f'{x:.1f}' for x in ms)} | {statistics.median(ms):.1f} | "
              f"{statistics.median(x['mfu'] for x in r) * 100:.1f}% | {max(x['peak'] for x in r):.2f} | "
              f"{statistics.median(x['fwd_ms'] for x in r):.1f} | {statistics.median(x['step_ms'] for x in r):.1f} | "
              f"{r[0]['waits']} | {', '.join(str(x['loss_last']) for x in r)} |")
if "off" in d and "on" in d:
    on = statistics.median(x["ms"] for x in d["on"]); off = statistics.median(x["ms"] for x in d["off"])
    print(f"on / off: {on / off:.3f} ({on:.1f} vs {off:.1f} ms/iter)")
json.dump(d, open(f"{R}/step_overlap.json", "w"), indent=1)
PY
echo "total: $(( $(date +%s) - T0 )) s"
