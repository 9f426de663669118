#!/usr/bin/env bash
# Device run LLAMA1B_ROWS (one GPU, one call, ~6-7 min after a cold build): issue 17's
# acceptance row. The Llama-3.2-1B shape (random weights, random tokens), bf16 compute with fp32
# master weights, micro-batch 4, seq 2048, AdamW, clipping 1.0, one GPU, in the same call:
#   zt_r1, zt_r2  `zerotrain train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b`
#                 (ZeRO-0), two runs (ZT_RUNS), before and after the compiled anchor
#   compiled      bench/anchors/llama_anchor.py --compile: transformers LlamaForCausalLM (sdpa),
#                 fp32 parameters + autocast bf16, torch.compile (default mode) of the forward
#                 and the loss, fused torch AdamW, clip 1.0
#   ds_z1, ds_z0  bench/anchors/llama_dist_anchor.py --mode deepspeed --zero-stage S (DS_STAGES,
#                 default "1 0"): DeepSpeed 0.19.8 bf16 (bf16 parameters, fp32 master: its
#                 ZeRO optimizer at 1, FP16_Optimizer at 0), FusedAdam, gradient_clipping 1.0,
#                 torchrun with one process; the wheels of .whl/ installed into SITE
#                 (default /tmp/site), on PYTHONPATH for these runs only
#   eager         llama_anchor.py without --compile (EAGER=1; off by default: llama_1gpu.sh)
# Each row: STEPS timed steps (default 12) after 3 warm-up, ms/iter the median. MFU: every row's
# tokens/s x 6(N_layers + V d) + 12 L d T FLOPs per token (zerotrain's formula, computed from
# the shape by llama1b_table.py; the check line compares it with zerotrain's own) / 989 TFLOP/s.
# Each run has its timeout, cut to what is left before DEADLINE (default 560 s after the start;
# a run with under 30 s left is skipped). Results in $OUT/llama1b_rows.tar.gz, re-packed after
# every run; the table last. Carry .whl (DeepSpeed and its dependencies).
set -uo pipefail
source scripts/device/common.sh llama1b_rows zerotrain_cli || exit 1
S=${STEPS:-12}; W=3; DEADLINE=${DEADLINE:-560}; SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl \
  > $R/pip.log 2>&1 || { echo "DeepSpeed wheels: install failed"; tail -3 $R/pip.log; }
pack() { tar -czf $OUT/llama1b_rows.tar.gz -C $OUT llama1b_rows; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() {  # name, timeout (s), stdout file, command...; stderr into $R/name.log
  local name=$1 t=$2 o=$3 l t1; shift 3
  l=$(left); [ $l -lt $t ] && t=$l
  if [ $t -lt 30 ]; then echo "$name: skipped, $l s left"; return; fi
  t1=$(date +%s)
  timeout $t "$@" > $o 2> $R/$name.log
  echo "$name rc=$? ($(( $(date +%s) - t1 )) s, limit $t s)"
  [ -s $R/$name.json ] || grep -E "Error|error|memory" $o $R/$name.log | grep -v Warning | tail -4
  pack
}
zt() {  # name: zerotrain's --summary into $R/name.json, its output into name.out
  run $1 120 $R/$1.out $Z train --config bench/configs/llama_bf16_z0.json --model llama3.2-1b --seq 2048 \
    --micro-batch 4 --steps $((S + W)) --warmup $W --device cuda --summary $R/$1.json
}
A="--seq 2048 --micro-batch 4 --steps $S --warmup $W"
for r in $(seq 1 ${ZT_RUNS:-2}); do
  zt zt_r$r
  [ $r = 1 ] && run compiled 240 $R/compiled.json python3 bench/anchors/llama_anchor.py $A --compile
done
for st in ${DS_STAGES:-1 0}; do
  # the first DeepSpeed run builds FusedAdam (JIT, ~1 min on a fresh machine)
  run ds_z$st 200 $R/ds_z$st.json env PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} torchrun --standalone \
    --nproc_per_node 1 bench/anchors/llama_dist_anchor.py --mode deepspeed --zero-stage $st --model llama3.2-1b $A
done
[ -n "${EAGER:-}" ] && run eager 120 $R/eager.json python3 bench/anchors/llama_anchor.py $A
python3 scripts/device/llama1b_table.py $R > /dev/null 2> $R/table.err || cat $R/table.err
pack
echo "total: $(( $(date +%s) - T0 )) s"
cat $R/table.md; rm -rf $R  # the tarball holds it all
