#!/usr/bin/env bash
# Device run TP_AB_2GPU (2 GPUs): a change to the tensor-parallel layers timed against the
# baseline tree (.base/base.tar.gz: `git archive BASE | gzip > .base/base.tar.gz`), both built
# in this call, `zerotrain train --tp 2` alternating base / new in fresh processes, ROUNDS
# times (default 2), with and without sequence parallelism (SP, default "0 1"). Shape as
# tp_2gpu.sh: GPT-2 XL with 20 heads of 80, seq 1024, micro-batch MB (4), bf16, ZeRO 0,
# AdamW, no activation checkpointing, random tokens. MG=1 adds megatron-core 0.19.2 at the
# same settings (bench/anchors/megatron_anchor.py; wheel in .whl/) once per SP setting.
# Prints a table: ms/iter (mean of each run's timed steps; median over rounds), fwd / bwd /
# step ms, peak GiB, new / base. Results: $OUT/tp_ab.tar.gz.
set -uo pipefail
mkdir -p /tmp/base && tar -xzf .base/base.tar.gz -C /tmp/base || exit 1
( cd /tmp/base && cmake -S . -B build-gpu -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > /tmp/base_cmake.log 2>&1 \
  && ninja -C build-gpu zerotrain_cli > /tmp/base_build.log 2>&1; echo "baseline build rc=$?" ) &
if [ "${MG:-0}" = 1 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
fi
source scripts/device/common.sh tp_ab zerotrain_cli
wait
[ -x /tmp/base/build-gpu/zerotrain ] || { tail -20 /tmp/base_build.log; exit 1; }
echo "both built: $(( $(date +%s) - T0 )) s"
STEPS=${STEPS:-12}; WARMUP=${WARMUP:-3}; MB=${MB:-4}
for r in $(seq 1 ${ROUNDS:-2}); do
  for sp in ${SP:-0 1}; do
    ZSP=""; [ "$sp" = 1 ] && ZSP="--set tensor_parallel.sequence_parallel=true"
    for v in base new; do
      Zv=$Z; [ $v = base ] && Zv=/tmp/base/build-gpu/zerotrain
      n=$v-sp$sp-r$r
      timeout ${ZT_TIMEOUT:-300} $Zv launch -n 2 -- $Zv train --config bench/configs/llama_bf16_z0.json --device cuda \
        --tp 2 --steps $STEPS --warmup $WARMUP --print-every 5 --data random --summary $R/$n.json \
        --model gpt2-xl --heads 20 --seq 1024 --set train_micro_batch_size_per_gpu=$MB $ZSP > $R/$n.log 2>&1
      echo "$n rc=$?"; grep -iE "error|what\(\)" $R/$n.log | head -3
    done
  done
done
if [ "${MG:-0}" = 1 ]; then
  for sp in ${SP:-0 1}; do
    MSP=""; [ "$sp" = 1 ] && MSP="--sequence-parallel"
    CUDA_DEVICE_MAX_CONNECTIONS=1 timeout ${MG_TIMEOUT:-300} torchrun --nproc_per_node 2 bench/anchors/megatron_anchor.py \
      --steps $STEPS --warmup $WARMUP --attention sdpa --out $R/mg-sp$sp.json --model gpt2-xl --heads 20 --seq 1024 \
      --micro-batch $MB $MSP > $R/mg-sp$sp.log 2>&1
    echo "mg-sp$sp rc=$?"
  done
fi
python3 - "$R" <<'PY'
import glob, json, os, statistics, sys
R = sys.argv[1]
def load(p):
    if not os.path.exists(p) or not os.path.getsize(p):
        return None
    return json.loads(open(p).read().strip().splitlines()[-1])
print(open(f"{R}/device.txt").read().strip())
print("| sp | base ms/iter (runs) | new ms/iter (runs) | new / base | fwd/bwd/step base | fwd/bwd/step new | peak GiB base / new | megatron ms/iter |")
print("|---|---|---|---|---|---|---|---|")
out = {}
for sp in ("0", "1"):
    rows = {}
    for v in ("base", "new"):
        runs = [j for j in (load(p) for p in sorted(glob.glob(f"{R}/{v}-sp{sp}-r*.json"))) if j]
        rows[v] = runs
    if not rows["base"] and not rows["new"]:
        continue
    def med(runs, key="ms_per_iter"):
        v = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(v) if v else float("nan")
    def phases(runs):
        ph = [r.get("phase_ms", {}) for r in runs]
        if not ph or not ph[0]:
            return "-"
        return "/".join(f"{statistics.median([p.get(k, 0) for p in ph]):.0f}" for k in ("forward", "backward", "step"))
    b, n = med(rows["base"]), med(rows["new"])
    m = load(f"{R}/mg-sp{sp}.json")
    out[sp] = {"base": [r["ms_per_iter"] for r in rows["base"]], "new": [r["ms_per_iter"] for r in rows["new"]],
               "megatron": m["ms_per_iter"] if m else None}
    runs = lambda v: ", ".join("%.1f" % r["ms_per_iter"] for r in rows[v])
    mg = "%.1f" % m["ms_per_iter"] if m else "-"
    print(f"| {sp} | {b:.1f} ({runs('base')}) | {n:.1f} ({runs('new')}) | {n / b:.3f} | {phases(rows['base'])} | "
          f"{phases(rows['new'])} | {med(rows['base'], 'peak_gib'):.2f} / {med(rows['new'], 'peak_gib'):.2f} | {mg} |")
json.dump(out, open(f"{R}/tp_ab.json", "w"), indent=1)
PY
tar -czf $OUT/tp_ab.tar.gz -C $OUT tp_ab && rm -rf $R/*.log
echo "total: $(( $(date +%s) - T0 )) s"
