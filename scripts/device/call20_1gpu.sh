#!/usr/bin/env bash
# Device run CALL20 (one GPU, one call, ~9 min from cold): [Stale Gradients] on issue 17's
# Llama-3.2-1B row, with its A/B and anchor in the same call, then the GPU tests and the Adam
# bandwidth probe. Builds zt_gpu and zerotrain once, then:
#   zt_on1, zt_off1, compiled, zt_on2, zt_off2   llama1b_rows.sh's zerotrain row
#       (bench/configs/llama_bf16_z0.json, Llama-3.2-1B shape, bf16, mb 4 x 2048, ZeRO-0) with
#       ZT_STALE_GRADS unset (the stale marks: on) and =0 (zero_grad's fill: the code before),
#       alternating around bench/anchors/llama_anchor.py --compile (transformers, torch.compile,
#       fused AdamW); STEPS timed steps (default 12) after 3 warm-up, median ms
#   zt_gpu    at one rank (the two-rank NCCL tests skip)
#   adam_bw   scripts/device/adam_bw.sh (only if DEADLINE leaves 70 s)
# Tables: $R/on/table.md and $R/off/table.md (llama1b_table.py: each set of zerotrain runs
# against the same compiled row) and the on/off ratio last. Results in $OUT/call20.tar.gz.
# OFF_ENV (default ZT_STALE_GRADS=0) is the environment of the "off" runs: another switch's
# A/B in the same shape (call 21: OFF_ENV=ZT_KERNEL_GRID=resident, [Streaming Grids]).
# ADAM_BW=0 skips the Adam probe.
set -uo pipefail
source scripts/device/common.sh call20 zt_gpu zerotrain_cli || exit 1
S=${STEPS:-12}; W=3; DEADLINE=${DEADLINE:-570}
pack() { tar -czf $OUT/call20.tar.gz -C $OUT call20; }
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
run() {  # name, timeout (s), stdout file, command...; stderr into $R/name.log
  local name=$1 t=$2 o=$3 l t1; shift 3
  l=$(left); [ $l -lt $t ] && t=$l
  if [ $t -lt 30 ]; then echo "$name: skipped, $l s left"; return; fi
  t1=$(date +%s)
  timeout $t "$@" > $o 2> $R/$name.log
  echo "$name rc=$? ($(( $(date +%s) - t1 )) s, limit $t s)"
  pack
}
OFF_ENV=${OFF_ENV:-ZT_STALE_GRADS=0}
zt() {  # name, "off" for OFF_ENV
  run $1 100 $R/$1.out env ${2:+$OFF_ENV} $Z train --config bench/configs/llama_bf16_z0.json \
    --model llama3.2-1b --seq 2048 --micro-batch 4 --steps $((S + W)) --warmup $W --device cuda --summary $R/$1.json
}
zt zt_on1 ""
zt zt_off1 off
run compiled 200 $R/compiled.json python3 bench/anchors/llama_anchor.py --seq 2048 --micro-batch 4 --steps $S \
  --warmup $W --compile
zt zt_on2 ""
zt zt_off2 off
for m in on off; do
  mkdir -p $R/$m; cp $R/zt_${m}*.json $R/$m/ 2>/dev/null; cp $R/compiled.json $R/$m/ 2>/dev/null
  python3 scripts/device/llama1b_table.py $R/$m > /dev/null 2> $R/$m/table.err || cat $R/$m/table.err
done
run zt_gpu 170 $R/zt_gpu.txt $Z launch -n 1 -- $B/zt_gpu
grep -E "^\[rank .\] \[  (PASSED|FAILED|SKIPPED) " $R/zt_gpu.txt | head -4; grep -E "FAILED  \]" $R/zt_gpu.txt | sort -u | head
if [ "${ADAM_BW:-1}" = 0 ]; then echo "adam_bw: skipped (ADAM_BW=0)"
elif [ $(left) -ge 70 ]; then OUT=$R/adam_bw timeout $(( $(left) - 5 )) bash scripts/device/adam_bw.sh > /dev/null 2>&1; echo "adam_bw rc=$?"
else echo "adam_bw: skipped, $(left) s left"; fi
pack
echo "total: $(( $(date +%s) - T0 )) s"
[ -f $R/adam_bw/adam_bw.txt ] && tail -30 $R/adam_bw/adam_bw.txt
for m in on off; do if [ $m = on ]; then echo "== on (head as is)"; else echo "== off ($OFF_ENV)"; fi; cat $R/$m/table.md 2>/dev/null | grep -E "^\| zt|^\| compiled|median|compiled transformers"; done
python3 - "$R" <<'PY'
import json, statistics, sys, glob
ms = lambda p: [json.loads(open(f).read().strip().splitlines()[-1])["ms_per_iter"] for f in sorted(glob.glob(p))]
on, off = ms(sys.argv[1] + "/zt_on*.json"), ms(sys.argv[1] + "/zt_off*.json")
if on and off:
    print(f"on {on} / off {off}: median ratio off/on {statistics.median(off) / statistics.median(on):.4f}")
PY
