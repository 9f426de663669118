#!/usr/bin/env bash
# Device run TP_PP_4GPU (4 GPUs): issue 26's tensor x pipeline row. megatron-core 0.19.2
# (bench/anchors/megatron_anchor.py --pp: parallel_state with tp 2 x pp 2, a GPTModel per stage,
# get_forward_backward_func's 1F1B; local spec, SDPA, no Transformer Engine or apex; wheel in
# .whl/) at tp 2 x pp 2 (dp 1) and, for reference, tp 2 x pp 1 x dp 2 (Megatron's
# no-pipelining gradient accumulation), against `zerotrain launch -n 4 -- zerotrain train
# --tp 2 --pp 2` and `--tp 2` (dp 2) at the same settings (docs/pipeline.md,
# docs/tensor-parallel.md): GPT-2 XL with 20 heads of 80 (as tp_2gpu.sh: 25 heads do not divide
# by tp 2; parameters and FLOPs are the same), bf16, micro-batch MB 4 x seq 1024, M 8
# micro-batches per step and replica, AdamW lr 1e-4, clip 1.0, fp32 master weights, ZeRO 0
# (bench/configs/llama_bf16_z0.json; Megatron's optimizer is not distributed either), random
# tokens. zerotrain's stages split the 48 blocks evenly as Megatron's do (pipeline.partition
# PARTITION, default "type:GPT2Block"), schedule 1f1b. Prints a table: ms/iter (zerotrain: mean
# of the steps after WARMUP; Megatron: the largest rank's median), tokens/s of the global batch
# (dp x M x MB x seq per step), MFU (zerotrain's FLOPs per token, 6N + 12LCT, over the 4 GPUs at
# PEAK_TFLOPS per GPU), peak GiB per stage (max over its ranks; zerotrain's from --summary where
# `train --pp` writes one, else "-"), loss first -> last, tokens/s zerotrain / Megatron.
# Results: $OUT/tp_pp_4gpu.tar.gz.
# Knobs: STEPS (12), WARMUP (3), MB (4), SEQ (1024), M (8), SP (0; "0 1" adds sequence
# parallelism), LAYOUTS ("pp2 dp2": tp 2 x pp 2, tp 2 x dp 2), PARTITION, PEAK_TFLOPS (989),
# ATTENTION (sdpa), ZT_TIMEOUT / MG_TIMEOUT (500 s per run).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
source scripts/device/common.sh tp_pp_4gpu zerotrain_cli
STEPS=${STEPS:-12}; WARMUP=${WARMUP:-3}; MB=${MB:-4}; SEQ=${SEQ:-1024}; M=${M:-8}
PARTITION=${PARTITION:-type:GPT2Block}
python3 -c "import megatron.core as m; print('megatron-core', m.__version__)" 2>&1 | tail -1

run_zt() {  # NAME ARGS...: zerotrain train on 4 ranks; --summary where the path writes one
  local name=$1; shift
  local cmd=($Z launch -n 4 -- $Z train --config bench/configs/llama_bf16_z0.json --device cuda --model gpt2-xl \
    --heads 20 --seq $SEQ --set train_micro_batch_size_per_gpu=$MB --set gradient_accumulation_steps=$M \
    --steps $STEPS --warmup $WARMUP --print-every 1 --data random "$@")
  timeout ${ZT_TIMEOUT:-500} "${cmd[@]}" --summary $R/$name.json > $R/$name.log 2>&1
  local rc=$?
  if grep -q -- "--metrics/--summary" $R/$name.log; then  # train --pp without --summary (yet): the log's line
    rm -f $R/$name.json
    timeout ${ZT_TIMEOUT:-500} "${cmd[@]}" > $R/$name.log 2>&1; rc=$?
  fi
  echo "$name rc=$rc ($(( $(date +%s) - T0 )) s)"; grep -iE "error|what\(\)" $R/$name.log | head -3
}
run_mg() {  # NAME ARGS...: the Megatron anchor on 4 processes, one JSON file
  local name=$1; shift
  CUDA_DEVICE_MAX_CONNECTIONS=1 timeout ${MG_TIMEOUT:-500} torchrun --nproc_per_node 4 bench/anchors/megatron_anchor.py \
    --model gpt2-xl --heads 20 --seq $SEQ --micro-batch $MB --micro-batches $M --steps $STEPS --warmup $WARMUP \
    --attention ${ATTENTION:-sdpa} --peak-tflops ${PEAK_TFLOPS:-989} --out $R/$name.json "$@" > $R/$name.log 2>&1
  echo "$name rc=$? ($(( $(date +%s) - T0 )) s)"; [ -s $R/$name.json ] || grep -v "^\s*$" $R/$name.log | grep -vi warn | tail -6
}
for sp in ${SP:-0}; do
  ZSP=""; MSP=""
  [ "$sp" = 1 ] && ZSP="--set tensor_parallel.sequence_parallel=true" && MSP="--sequence-parallel"
  for l in ${LAYOUTS:-pp2 dp2}; do
    if [ $l = pp2 ]; then
      run_zt zt_tp2pp2_sp$sp --tp 2 --pp 2 --set pipeline.schedule=1f1b --set pipeline.partition=$PARTITION $ZSP
      run_mg mg_tp2pp2_sp$sp --tp 2 --pp 2 $MSP
    else
      run_zt zt_tp2dp2_sp$sp --tp 2 $ZSP
      run_mg mg_tp2dp2_sp$sp --tp 2 --pp 1 $MSP
    fi
  done
done
python3 - "$R" "$SEQ" "${PEAK_TFLOPS:-989}" "$M" "$MB" <<'PY'
import json, os, re, sys
sys.path.insert(0, "bench/anchors")
import megatron_anchor as ma  # flops_per_token: zerotrain's formula (no torch needed)
R, seq, peak, M, MB = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4], sys.argv[5]
fpt = ma.flops_per_token(ma.parse_args(["--model", "gpt2-xl", "--heads", "20"]).shape, seq)
LINE = re.compile(r"pipeline: loss ([\d.]+) -> ([\d.]+), ([\d.]+) ms/step, (\d+) tokens/s")
def megatron(name):
    p = f"{R}/{name}.json"
    return json.load(open(p)) if os.path.exists(p) and os.path.getsize(p) else None
def zerotrain(name):
    p = f"{R}/{name}.json"
    if os.path.exists(p) and os.path.getsize(p):
        z = json.loads(open(p).read().strip().splitlines()[-1])
        per = z.get("peak_gib_per_stage") or [z.get("peak_gib")]
        return dict(ms=z["ms_per_iter"], tok=z["tokens_per_s"], peaks=per,
                    loss=(z.get("loss_first"), z.get("loss_last", z.get("loss"))))
    log = f"{R}/{name}.log"
    m = LINE.search(open(log).read()) if os.path.exists(log) else None
    return dict(ms=float(m[3]), tok=float(m[4]), peaks=None, loss=(float(m[1]), float(m[2]))) if m else None
def fmt_loss(l):
    return f"{l[0]:.3f} -> {l[1]:.3f}" if l and l[0] is not None and l[1] is not None else "-"
print(open(f"{R}/device.txt").read().strip())
print("| run | ms/iter | tokens/s | MFU | peak GiB per stage | loss first -> last | zerotrain / Megatron (tokens/s) |")
print("|---|---|---|---|---|---|---|")
for sp in ("0", "1"):
    for lay, tag in (("tp2pp2", "tp 2 x pp 2 (1F1B)"), ("tp2dp2", "tp 2 x dp 2")):
        z, m = zerotrain(f"zt_{lay}_sp{sp}"), megatron(f"mg_{lay}_sp{sp}")
        if z is None and m is None:
            continue
        tag += " + sp" if sp == "1" else ""
        ratio = f"{z['tok'] / m['tokens_per_s']:.2f}x" if z and m else "-"
        mfu = lambda tok: f"{100 * fpt * tok / 4 / 1e12 / peak:.1f}%"
        if z:
            peaks = ", ".join(f"{p:.1f}" for p in z["peaks"]) if z["peaks"] and None not in z["peaks"] else "-"
            print(f"| zerotrain {tag} | {z['ms']:.1f} | {z['tok']:.0f} | {mfu(z['tok'])} | {peaks} | "
                  f"{fmt_loss(z['loss'])} | {ratio} |")
        else:
            print(f"| zerotrain {tag} | failed (see zt_{lay}_sp{sp}.log) | | | | | |")
        if m:
            print(f"| Megatron-core {tag} | {m['ms_per_iter']:.1f} | {m['tokens_per_s']:.0f} | {mfu(m['tokens_per_s'])} | "
                  f"{', '.join(f'{p:.1f}' for p in m['peak_gib_per_stage'])} | "
                  f"{fmt_loss((m['loss_first'], m['loss_last']))} | 1.00x |")
        else:
            print(f"| Megatron-core {tag} | failed (see mg_{lay}_sp{sp}.log) | | | | | |")
print(f"per step and replica: {M} micro-batches of {MB} x {seq}; FLOPs/token {fpt:.4g}; MFU at {peak:g} TFLOPS/GPU")
PY
tar -czf $OUT/tp_pp_4gpu.tar.gz -C $OUT tp_pp_4gpu && rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
