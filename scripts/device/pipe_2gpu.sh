#!/usr/bin/env bash
# Device run PIPE_2GPU (2 GPUs): issue 25. zerotrain's pipeline engine at pp 2 on GPT-2 XL
# (MODEL), bf16, micro-batch 4 x seq 1024, 8 micro-batches, each schedule (GPipe, 1F1B,
# interleaved, ZB-H1): bubble per stage from CUDA events against the formula, tokens/s and
# peak memory per stage (build/bench_pipe_bubble). Then DeepSpeed 0.19.8's PipelineEngine on
# the same model shape and batch (bench/anchors/ds_pipe_anchor.py, wheels in .whl/), then
# (GPU_TESTS=1) zt_gpu at 2 ranks. Results: $OUT/pipe_2gpu.tar.gz, $OUT/gpu_tests.txt.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
source scripts/device/common.sh pipe_2gpu bench_pipe_bubble zerotrain_cli ${GPU_TESTS:+zt_gpu}
MODEL=${MODEL:-gpt2-xl}; MB=${MB:-4}; SEQ=${SEQ:-1024}; M=${M:-8}
timeout ${PIPE_TIMEOUT:-300} $Z launch -n 2 -- $B/bench_pipe_bubble --device cuda --model $MODEL --dtype bf16 \
  --micro-batch $MB --seq $SEQ --micro-batches $M --batches ${BATCHES:-5} --warmup 2 > $R/zerotrain_pipe.log 2>&1
echo "zerotrain pipe rc=$?"; grep -o '{"bench".*' $R/zerotrain_pipe.log > $R/zerotrain_pipe.jsonl
grep -iE "error|what\(\)" $R/zerotrain_pipe.log | head -5
[ -n "${SKIP_DS:-}" ] || timeout ${DS_TIMEOUT:-200} torchrun --nproc_per_node 2 bench/anchors/ds_pipe_anchor.py --model $MODEL --micro-batch $MB \
  --seq $SEQ --micro-batches $M --steps ${BATCHES:-5} --warmup 2 --out $R/deepspeed_pipe.json > $R/deepspeed_pipe.log 2>&1
echo "deepspeed pipe rc=$?"; [ -s $R/deepspeed_pipe.json ] || grep -v "^\s*$" $R/deepspeed_pipe.log | tail -8
python3 - "$R" <<'PY'
import json, sys, os
R = sys.argv[1]
rows = [json.loads(l) for l in open(f"{R}/zerotrain_pipe.jsonl") if l.strip()]
ds = json.load(open(f"{R}/deepspeed_pipe.json")) if os.path.exists(f"{R}/deepspeed_pipe.json") else {}
print("| run | ms/batch | tokens/s | bubble measured | formula | busy per stage | peak GiB per stage | vs DeepSpeed |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    sp = ds.get("ms_per_iter") and f"{ds['ms_per_iter'] / r['ms_per_batch']:.2f}x" or "-"
    print(f"| zerotrain {r['schedule']} | {r['ms_per_batch']:.1f} | {r['tokens_per_s']:.0f} | {r['bubble_measured']:.3f} | "
          f"{r['bubble_formula']:.3f} | {', '.join(f'{b:.2f}' for b in r['stage_busy_fraction'])} | "
          f"{', '.join(f'{p:.1f}' for p in r['peak_gib_per_stage'])} | {sp} |")
if ds.get("status") == "ok":
    print(f"| DeepSpeed PipelineEngine (1F1B) | {ds['ms_per_iter']:.1f} | {ds['tokens_per_s']:.0f} | - | - | - | "
          f"{', '.join(f'{p:.1f}' for p in ds['peak_gib_per_stage'])} | 1.00x |")
else:
    print("DeepSpeed:", ds)
PY
tar -czf $OUT/pipe_2gpu.tar.gz -C $OUT pipe_2gpu && rm -rf $R
if [ -n "${GPU_TESTS:-}" ]; then
  timeout 150 $Z launch -n 2 -- $B/zt_gpu > $OUT/gpu_tests.txt 2>&1; echo "zt_gpu rc=$?"
  grep -E "\[  (PASSED|FAILED|SKIPPED) " $OUT/gpu_tests.txt | sort -u | head -4
fi
echo "total: $(( $(date +%s) - T0 )) s"
