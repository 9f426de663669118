#!/usr/bin/env bash
# Device run TP_2GPU (2 GPUs): issue 26. `zerotrain train --tp 2` (docs/tensor-parallel.md)
# against megatron-core 0.19.2 (bench/anchors/megatron_anchor.py: GPTModel, local layer spec,
# SDPA attention, no Transformer Engine or apex; wheel in .whl/) on the same shapes, bf16, dp 1,
# without and with sequence parallelism:
#   gpt2-xl       48 layers, C 1600, 20 heads of 80 (GPT-2 XL's 25 heads do not divide by
#                 tp 2; parameters and FLOPs are the same), seq 1024, micro-batch GPT2_MB
#   llama3.2-3b   bench/configs/models/llama3.2-3b.json (28 layers, 3072, 24 heads / 8 kv,
#                 SwiGLU 8192, vocab 128256, tied), seq 2048, micro-batch LLAMA_MB
# Both: AdamW lr 1e-4, clip 1.0, fp32 master weights, no activation checkpointing, random
# tokens. zerotrain: bench/configs/llama_bf16_z0.json (ZeRO 0: Megatron's optimizer here is
# not distributed either), ms/iter = mean wall time of the steps after WARMUP; Megatron:
# median of its timed steps. Prints a table: ms/iter, tokens/s (each replica's once), MFU
# (both with zerotrain's FLOPs per token and its peak for the GPU), activation GiB (what forward
# leaves for backward: zerotrain's phase memory after forward - after the step, Megatron's
# activation_gib), peak GiB (max over the
# ranks), speed ratio zerotrain / Megatron. Results: $OUT/tp_2gpu.tar.gz.
# Knobs: STEPS (12), WARMUP (3), GPT2_MB (4), LLAMA_MB (2), SP ("0 1": sequence parallelism
# off / on), MODELS ("gpt2 llama"), ATTENTION (sdpa; "local": Megatron's own attention),
# ZT_TIMEOUT / MG_TIMEOUT (500 s per run).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target ${SITE:-/tmp/site} .whl/*.whl \
  && export PYTHONPATH=${SITE:-/tmp/site} || exit 1
source scripts/device/common.sh tp_2gpu zerotrain_cli
STEPS=${STEPS:-12}; WARMUP=${WARMUP:-3}; GPT2_MB=${GPT2_MB:-4}; LLAMA_MB=${LLAMA_MB:-2}
python3 -c "import megatron.core as m; print('megatron-core', m.__version__)" 2>&1 | tail -1

run_zt() {  # NAME ARGS...: zerotrain train --tp 2, one --summary JSON line
  local name=$1; shift
  timeout ${ZT_TIMEOUT:-500} $Z launch -n 2 -- $Z train --config bench/configs/llama_bf16_z0.json --device cuda \
    --tp 2 --steps $STEPS --warmup $WARMUP --print-every 5 --data random --summary $R/$name.json "$@" > $R/$name.log 2>&1
  echo "$name rc=$?"; grep -iE "error|what\(\)" $R/$name.log | head -3
}
run_mg() {  # NAME ARGS...: the Megatron anchor on 2 processes, one JSON file
  local name=$1; shift
  CUDA_DEVICE_MAX_CONNECTIONS=1 timeout ${MG_TIMEOUT:-500} torchrun --nproc_per_node 2 bench/anchors/megatron_anchor.py \
    --steps $STEPS --warmup $WARMUP --attention ${ATTENTION:-sdpa} --out $R/$name.json "$@" > $R/$name.log 2>&1
  echo "$name rc=$?"; [ -s $R/$name.json ] || grep -v "^\s*$" $R/$name.log | grep -vi warn | tail -6
}
for sp in ${SP:-0 1}; do
  ZSP=""; MSP=""
  [ "$sp" = 1 ] && ZSP="--set tensor_parallel.sequence_parallel=true" && MSP="--sequence-parallel"
  for m in ${MODELS:-gpt2 llama}; do
    if [ $m = gpt2 ]; then
      run_zt zt_gpt2xl_sp$sp --model gpt2-xl --heads 20 --seq 1024 --set train_micro_batch_size_per_gpu=$GPT2_MB $ZSP
      run_mg mg_gpt2xl_sp$sp --model gpt2-xl --heads 20 --seq 1024 --micro-batch $GPT2_MB $MSP
    else
      run_zt zt_llama3b_sp$sp --model bench/configs/models/llama3.2-3b.json --seq 2048 \
        --set train_micro_batch_size_per_gpu=$LLAMA_MB $ZSP
      run_mg mg_llama3b_sp$sp --model llama3.2-3b --seq 2048 --micro-batch $LLAMA_MB $MSP
    fi
  done
done
python3 - "$R" <<'PY'
import json, os, sys
R = sys.argv[1]
def load(name):
    p = f"{R}/{name}.json"
    if not os.path.exists(p) or not os.path.getsize(p):
        return None
    return json.loads(open(p).read().strip().splitlines()[-1])
print(open(f"{R}/device.txt").read().strip())
print("| run | ms/iter | tokens/s | MFU | activation GiB | peak GiB | zerotrain / Megatron (tokens/s) |")
print("|---|---|---|---|---|---|---|")
def zact(z):  # what forward leaves for backward: memory after forward - after the step
    m = z.get("phase_mem_gib") or {}
    try:
        return f"{m['forward']['after'] - m['step']['after']:.2f}"
    except (KeyError, TypeError):
        return "-"
def mact(m):
    return f"{m['activation_gib']:.2f}" if m.get("activation_gib") is not None else "-"
for model in ("gpt2xl", "llama3b"):
    for sp in ("0", "1"):
        z, m = load(f"zt_{model}_sp{sp}"), load(f"mg_{model}_sp{sp}")
        if z is None and m is None:
            continue
        tag = f"{model} tp 2{' + sp' if sp == '1' else ''}"
        # FLOPs per token per GPU from zerotrain's summary (its formula), for both rows.
        fpt = z["tflops_per_gpu"] * 1e12 / z["tokens_per_s"] if z and z.get("tokens_per_s") else None
        peak = z.get("peak_tflops", 0) if z else 0
        def mfu(tok):
            return f"{100 * tok * fpt / 1e12 / peak:.1f}%" if fpt and peak else "-"
        ratio = f"{z['tokens_per_s'] / m['tokens_per_s']:.2f}x" if z and m and m.get("tokens_per_s") else "-"
        if z:
            print(f"| zerotrain {tag} | {z['ms_per_iter']:.1f} | {z['tokens_per_s']:.0f} | {mfu(z['tokens_per_s'])} | {zact(z)} | "
                  f"{z['peak_gib']:.1f} | {ratio} |")
        else:
            print(f"| zerotrain {tag} | failed (see zt_{model}_sp{sp}.log) | | | | | |")
        if m:
            print(f"| Megatron-core {tag} | {m['ms_per_iter']:.1f} | {m['tokens_per_s']:.0f} | {mfu(m['tokens_per_s'])} | {mact(m)} | "
                  f"{m['peak_gib']:.1f} | 1.00x |")
        else:
            print(f"| Megatron-core {tag} | failed (see mg_{model}_sp{sp}.log) | | | | | |")
PY
tar -czf $OUT/tp_2gpu.tar.gz -C $OUT tp_2gpu && rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
