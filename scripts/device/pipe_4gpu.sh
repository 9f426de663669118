#!/usr/bin/env bash
# Device run PIPE_4GPU (4 GPUs): issue 25's four-GPU row. zerotrain's pipeline engine at
# pp 2 x dp 2 on GPT-2 XL (MODEL), bf16, micro-batch 4 x seq 1024, 8 micro-batches per replica,
# ZeRO-1 and ZeRO-2 over dp (ZEROS), schedules SCHEDULES (default 1f1b,interleaved,zb-h1):
# bubble per stage, tokens/s (both replicas) and peak memory per stage (the larger of its two
# replicas), build/bench_pipe_bubble --pp 2 --zero-stage S. Then DeepSpeed 0.19.8's
# PipelineEngine at pp 2 x dp 2 with ZeRO-1 (DeepSpeed refuses stage 2 with a pipeline) and
# ZeRO-0 (bench/anchors/ds_pipe_anchor.py --pp 2; wheels in .whl/). Results:
# $OUT/$NAME.tar.gz (NAME, default pipe_4gpu); the table last. DS_ZEROS="" skips DeepSpeed.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
NAME=${NAME:-pipe_4gpu}
source scripts/device/common.sh $NAME bench_pipe_bubble zerotrain_cli
MODEL=${MODEL:-gpt2-xl}; MB=${MB:-4}; SEQ=${SEQ:-1024}; M=${M:-8}; ZEROS=${ZEROS:-"1 2"}
SCHEDULES=${SCHEDULES:-1f1b,interleaved,zb-h1}
for z in $ZEROS; do
  timeout ${PIPE_TIMEOUT:-200} $Z launch -n 4 -- $B/bench_pipe_bubble --device cuda --model $MODEL --dtype bf16 \
    --pp 2 --zero-stage $z --micro-batch $MB --seq $SEQ --micro-batches $M --batches ${BATCHES:-4} --warmup 2 \
    --schedules $SCHEDULES > $R/zerotrain_pipe_z$z.log 2>&1
  echo "zerotrain pipe z$z rc=$? ($(( $(date +%s) - T0 )) s)"; grep -o '{"bench".*' $R/zerotrain_pipe_z$z.log >> $R/zerotrain_pipe.jsonl
  grep -iE "error|what\(\)" $R/zerotrain_pipe_z$z.log | head -5
done
for z in ${DS_ZEROS-1 0}; do
  timeout ${DS_TIMEOUT:-200} torchrun --nproc_per_node 4 bench/anchors/ds_pipe_anchor.py --pp 2 --zero-stage $z \
    --model $MODEL --micro-batch $MB --seq $SEQ --micro-batches $M --steps ${BATCHES:-4} --warmup 2 \
    --out $R/deepspeed_pipe_z$z.json > $R/deepspeed_pipe_z$z.log 2>&1
  echo "deepspeed pipe z$z rc=$? ($(( $(date +%s) - T0 )) s)"
  [ -s $R/deepspeed_pipe_z$z.json ] || grep -v "^\s*$" $R/deepspeed_pipe_z$z.log | tail -8
done
python3 - "$R" <<'PY'
import json, sys, os, glob
R = sys.argv[1]
rows = [json.loads(l) for l in open(f"{R}/zerotrain_pipe.jsonl") if l.strip()] if os.path.exists(f"{R}/zerotrain_pipe.jsonl") else []
ds = {}
for f in sorted(glob.glob(f"{R}/deepspeed_pipe_z*.json")):
    d = json.load(open(f)); ds[d.get("zero_stage")] = d
ref = ds.get(1, {})
print("| run | ms/batch | tokens/s | bubble measured | formula | peak GiB per stage | vs DeepSpeed ZeRO-1 |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    sp = f"{ref['ms_per_iter'] / r['ms_per_batch']:.2f}x" if ref.get("status") == "ok" else "-"
    print(f"| zerotrain pp2 x dp2 ZeRO-{r['zero_stage']} {r['schedule']} | {r['ms_per_batch']:.1f} | {r['tokens_per_s']:.0f} | "
          f"{r['bubble_measured']:.3f} | {r['bubble_formula']:.3f} | {', '.join(f'{p:.1f}' for p in r['peak_gib_per_stage'])} | {sp} |")
for z, d in sorted(ds.items()):
    if d.get("status") == "ok":
        print(f"| DeepSpeed PipelineEngine pp2 x dp2 ZeRO-{z} (1F1B) | {d['ms_per_iter']:.1f} | {d['tokens_per_s']:.0f} | - | - | "
              f"{', '.join(f'{p:.1f}' for p in d['peak_gib_per_stage'])} | {ref['ms_per_iter'] / d['ms_per_iter']:.2f}x |" if ref.get("status") == "ok" else "")
    else:
        print(f"DeepSpeed ZeRO-{z}:", {k: d.get(k) for k in ("status", "error")})
PY
tar -czf $OUT/$NAME.tar.gz -C $OUT $NAME && rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
