#!/usr/bin/env bash
# Device run PIPE_ZBW_2GPU (2 GPUs): issue 25's ZB-H1 weight pass from deferred closures
# ([Deferred Weight Gradients], src/models/deferred_grad.h). First zt_gpu's
# DeferredWeightGradsGpu (the fused kernels' paths: LayerNormFn, RmsNormFn, the LM head, the
# addmm into W.grad; fp32 and bf16) on one GPU, then bench_pipe_bubble at pp 2 on GPT-2 XL
# (MODEL), bf16, micro-batch 4 x seq 1024, 8 micro-batches: 1f1b, zb-h1 with the deferred W
# (default) and zb-h1 with ZT_PIPE_ZB_DEFERRED_W=0 (W = an autograd pass, as before) in one
# call, so the three rows are on the same machine. Last: a table of ms/batch, the last
# stage's F/B/W per batch, bubble and peak GiB per stage. Results: $OUT/pipe_zbw_2gpu.tar.gz.
#   bash scripts/device/pipe_zbw_2gpu.sh      (about 6-8 minutes with the build)
set -uo pipefail
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
python3 - "$R" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/bench.jsonl") if l.strip()]
print("| run | ms/batch | last stage F / B / W ms per batch | bubble (formula) | peak GiB per stage | loss |")
print("|---|---|---|---|---|---|")
for r in rows:
    t = r.get("last_stage_ms", {})
    print(f"| {r['label']} | {r['ms_per_batch']:.1f} | {t.get('F', 0):.1f} / {t.get('B', 0):.1f} / {t.get('W', 0):.1f} | "
          f"{r['bubble_measured']:.3f} ({r['bubble_formula']:.3f}) | {', '.join(f'{p:.1f}' for p in r['peak_gib_per_stage'])} | "
          f"{r.get('loss_last', 0):.4f} |")
PY
tar -czf $OUT/pipe_zbw_2gpu.tar.gz -C $OUT pipe_zbw_2gpu && rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
