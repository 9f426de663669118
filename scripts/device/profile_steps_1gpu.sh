#!/usr/bin/env bash
# Device run PROFILE_STEPS_1GPU (one GPU, ~3 min from cold): where a Llama-3.2-1B step's time goes
# when work is already queued, as in an unprofiled run (issue 17). One build (zerotrain_cli), then
# `train --profile 4 --profile-steps 3` (bf16, ZeRO-0, mb 4, seq 2048): the first profiled step
# starts from an idle device, the next two do not. Prints per step the wall, the kernel time and
# the largest idle gaps with the kernels around them, and every CUDA runtime call over 100 us
# (a synchronising call shows up there). Output: $OUT/profile_steps/ (trace, text, analysis).
set -uo pipefail
source scripts/device/common.sh profile_steps zerotrain_cli || exit 1
timeout 120 $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 --micro-batch 4 \
  --steps 9 --warmup 3 --device cuda --print-every 1 --profile 4 --profile-steps 3 --profile-out $R/prof \
  --summary $R/summary.json > $R/train.log 2>&1
echo "train rc=$?"; grep -E "ms/iteration|Error|error" $R/train.log | head -3
python3 - $R > $R/analysis.txt <<'PY'
import glob, json, sys
R = sys.argv[1]
d = json.load(open(glob.glob(f"{R}/prof.rank0.json")[0]))
ev = d["traceEvents"]
k = sorted((e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")),
           key=lambda e: e["ts"])
t0 = k[0]["ts"]
# a step ends with the report's copy to host memory (the first device-to-host copy after its
# fused Adam launches); the next step's kernels follow. (Before [Stale Gradients] the split was
# the gradient fill after the Adam, which no longer runs.)
ends, seen_adam = [], False
for i, e in enumerate(k):
    if "fused_adam" in e["name"]: seen_adam = True
    elif seen_adam and e.get("cat") == "gpu_memcpy" and "DtoH" in e["name"]:
        ends.append(i + 1); seen_adam = False
starts = [0] + ends[:-1]
for n, (a, b) in enumerate(zip(starts, ends)):
    ks = k[a:b]
    wall = (ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]) / 1e3
    busy = sum(e["dur"] for e in ks) / 1e3
    gaps = []
    for p, q in zip(ks, ks[1:]):
        g = q["ts"] - (p["ts"] + p["dur"])
        if g > 0: gaps.append((g, (p["ts"] - t0) / 1e3, p["name"][:60], q["name"][:60]))
    gaps.sort(reverse=True)
    print(f"step {n}: wall {wall:.2f} ms, kernels {busy:.2f} ms, idle {wall - busy:.2f} ms "
          f"({sum(g[0] for g in gaps if g[0] > 20) / 1e3:.2f} ms in gaps > 20 us, {len(ks)} kernels)")
    if n + 1 < len(ends):
        nxt = k[ends[n]]
        print(f"  to the next step's first kernel: {(nxt['ts'] - (ks[-1]['ts'] + ks[-1]['dur'])) / 1e3:.3f} ms")
    for g in gaps[:8]: print(f"  gap {g[0]:8.1f} us at {g[1]:8.2f} ms  after {g[2]} | before {g[3]}")
rt = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "cuda_runtime" and e.get("dur", 0) > 100]
print(f"CUDA runtime calls over 100 us: {len(rt)}")
for e in sorted(rt, key=lambda e: e["ts"])[:40]:
    print(f"  {(e['ts'] - t0) / 1e3:9.2f} ms {e['dur']:9.1f} us {e['name']}")
PY
cat $R/analysis.txt | head -80
gzip -f $R/prof.rank0.json
echo "total: $(( $(date +%s) - T0 )) s"
