#!/usr/bin/env bash
# Device run PIPE_ZBW_2GPU (2 GPUs): issue 25's ZB-H1 weight pass from deferred closures
# ([Deferred Weight Gradients], src/models/deferred_grad.h). First zt_gpu's
# DeferredWeightGradsGpu (the fused kernels' paths: LayerNormFn, RmsNormFn, the LM head, the
# addmm into W.grad; fp32 and bf16) on one GPU, then bench_pipe_bubble at pp 2 on GPT-2 XL
# (MODEL), bf16, micro-batch 4 x seq 1024, 8 micro-batches: 1f1b, zb-h1 with the deferred W
# (default) and zb-h1 with ZT_PIPE_ZB_DEFERRED_W=0 (W = an autograd pass, as before) in one
# call, so the three rows are on the same machine; then, when .whl/ holds the DeepSpeed wheels
# (SKIP_DS unset), DeepSpeed 0.19.8's PipelineEngine (1F1B) on the same shape and batch
# (bench/anchors/ds_pipe_anchor.py, wheels installed into SITE, default /tmp/site). Last: a
# table of ms/batch, the last stage's F/B/W per batch, bubble, peak GiB per stage and the ratio
# to DeepSpeed. Results: $OUT/pipe_zbw_2gpu.tar.gz.
#   bash scripts/device/pipe_zbw_2gpu.sh      (about 6-8 minutes with the build)
set -uo pipefail
SITE=${SITE:-/tmp/site}
source scripts/device/common.sh pipe_zbw_2gpu bench_pipe_bubble zerotrain_cli zt_gpu
MODEL=${MODEL:-gpt2-xl}; MB=${MB:-4}; SEQ=${SEQ:-1024}; M=${M:-8}
timeout 120 $B/zt_gpu --gtest_filter='DeferredWeightGradsGpu*' > $R/gpu_test.txt 2>&1
echo "zt_gpu DeferredWeightGradsGpu rc=$?"; grep -E "\[  (PASSED|FAILED|SKIPPED) |Failure|exceeds" $R/gpu_test.txt | head -6
bench() {  # $1 = label, $2 = schedules, then env
  local label=$1 sched=$2; shift 2
  env "$@" timeout ${PIPE_TIMEOUT:-200} $Z launch -n 2 -- $B/bench_pipe_bubble --device cuda --model $MODEL --dtype bf16 \
    --micro-batch $MB --seq $SEQ --micro-batches $M --batches ${BATCHES:-5} --warmup 2 --schedules $sched \
    > $R/bench_$label.log 2>&1
  echo "bench $label rc=$?"; grep -iE "error|what\(\)" $R/bench_$label.log | head -3
  grep -o '{"bench".*' $R/bench_$label.log | sed "s/^{/{\"label\": \"$label\", /" >> $R/bench.jsonl
}
bench 1f1b 1f1b ZT_PIPE_ZB_DEFERRED_W=1
bench zbh1_deferred zb-h1 ZT_PIPE_ZB_DEFERRED_W=1
bench zbh1_autograd_w zb-h1 ZT_PIPE_ZB_DEFERRED_W=0
if [ -z "${SKIP_DS:-}" ] && ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl > $R/pip.log 2>&1
  PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} timeout ${DS_TIMEOUT:-240} torchrun --standalone --nproc_per_node 2 \
    bench/anchors/ds_pipe_anchor.py --model $MODEL --micro-batch $MB --seq $SEQ --micro-batches $M --steps ${BATCHES:-5} \
    --warmup 2 --out $R/deepspeed_pipe.json > $R/deepspeed_pipe.log 2>&1
  echo "deepspeed pipe rc=$?"; [ -s $R/deepspeed_pipe.json ] || grep -v "^\s*$" $R/deepspeed_pipe.log | tail -6
fi
python3 - "$R" <<'PY'
import json, os, sys
R = sys.argv[1]
rows = [json.loads(l) for l in open(f"{R}/bench.jsonl") if l.strip()]
ds = json.load(open(f"{R}/deepspeed_pipe.json")) if os.path.exists(f"{R}/deepspeed_pipe.json") else {}
dms = ds.get("ms_per_iter") if ds.get("status") == "ok" else None
print("| run | ms/batch | last stage F / B / W ms per batch | bubble (formula) | peak GiB per stage | loss | DeepSpeed / this |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    t = r.get("last_stage_ms", {})
    ratio = f"{dms / r['ms_per_batch']:.2f}x" if dms else "-"
    print(f"| {r['label']} | {r['ms_per_batch']:.1f} | {t.get('F', 0):.1f} / {t.get('B', 0):.1f} / {t.get('W', 0):.1f} | "
          f"{r['bubble_measured']:.3f} ({r['bubble_formula']:.3f}) | {', '.join(f'{p:.1f}' for p in r['peak_gib_per_stage'])} | "
          f"{r.get('loss_last', 0):.4f} | {ratio} |")
if dms:
    print(f"| DeepSpeed PipelineEngine (1F1B) | {dms:.1f} | - | - | {', '.join(f'{p:.1f}' for p in ds['peak_gib_per_stage'])} | - | 1.00x |")
elif ds:
    print("DeepSpeed:", ds)
PY
tar -czf $OUT/pipe_zbw_2gpu.tar.gz -C $OUT pipe_zbw_2gpu && rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
