#!/usr/bin/env bash
# Device run PIPE_LLAMA_2GPU (2 GPUs): issue 25's pipeline comparison on the Llama-3.2-1B shape
# (MODEL, default llama3.2-1b; random weights and tokens). bench_pipe_bubble at pp 2 (the Llama
# cut by PipeEngine as `zerotrain train --model MODEL --pp 2` cuts it, partition "parameters"),
# bf16, micro-batch MB (4) x seq SEQ (2048), M (8) micro-batches, BATCHES (5) timed batches after
# 2: 1f1b, zb-h1 (the deferred weight pass, the default), interleaved (2 virtual stages) and
# gpipe, each its own launch; then, when .whl/ holds the DeepSpeed wheels (SKIP_DS unset),
# DeepSpeed 0.19.8's PipelineEngine (1F1B) on the same shape and batch: transformers'
# LlamaDecoderLayers in a PipelineModule, the embedding tied to the head
# (bench/anchors/ds_pipe_anchor.py; wheels installed into SITE, default /tmp/site; transformers
# from the machine's python3). Last: a table of ms/batch, tokens/s, bubble vs formula, peak GiB
# per stage, loss and DeepSpeed's time over each run's.
# Memory (estimate, 80 GB per GPU): model states ~16 B per parameter, ~12 GiB per stage;
# activations ~0.5 GiB (zerotrain) / ~1 GiB (transformers' unfused layers) per decoder layer and
# micro-batch of 4 x 2048: 1f1b/zb-h1/DeepSpeed keep <= 2-3 micro-batches of 8 layers in flight
# (~20-40 GiB), gpipe all 8 (~45 GiB), last at seq 2048 so an out-of-memory costs nothing else.
# Every step runs under a timeout; DEADLINE (default 480 s after the build, and never past
# HARD_DEADLINE, default 570 s from the start) guards each start, DS_RESERVE (150 s) is kept for
# DeepSpeed (per DeepSpeed run). Knobs: PARTITION (zerotrain's pipeline.partition, e.g. compute;
# default: the bench's), SCHEDULES (default "1f1b zb-h1 interleaved gpipe"), ZB_MAX_PENDING
# (zerotrain's pipeline.zb_max_pending_w, e.g. "0" or "0 1": one more zb-h1 row per value, run
# right after the zb-h1 row, as the bench's "zb-h1:K" schedule; [ZB-H1 Pending Cap]), DS_PARTITIONS
# (DeepSpeed's partition_method, one run each, default "parameters"; every ratio is against the
# fastest), NAME (results folder/tarball, default pipe_llama_2gpu; MODEL=gpt2-xl works too).
# Honours CUDA_VISIBLE_DEVICES (2 GPUs). Results: $OUT/$NAME.tar.gz.
#   bash scripts/device/pipe_llama_2gpu.sh      (carry .whl; about 6-8 minutes with the build)
set -uo pipefail
SITE=${SITE:-/tmp/site}
NAME=${NAME:-pipe_llama_2gpu}  # the results folder and tarball (two instances side by side: two names)
source scripts/device/common.sh $NAME bench_pipe_bubble zerotrain_cli || exit 1
MODEL=${MODEL:-llama3.2-1b}; MB=${MB:-4}; SEQ=${SEQ:-2048}; M=${M:-8}; BATCHES=${BATCHES:-5}
DEADLINE=${DEADLINE:-480}; HARD_DEADLINE=${HARD_DEADLINE:-570}; DS_RESERVE=${DS_RESERVE:-150}
TB=$(date +%s)
left() {  # seconds left before the earlier of the two deadlines
  local a=$(( DEADLINE - ($(date +%s) - TB) )) b=$(( HARD_DEADLINE - ($(date +%s) - T0) ))
  echo $(( a < b ? a : b ))
}
DS=0; [ -z "${SKIP_DS:-}" ] && ls .whl/deepspeed-*.whl > /dev/null 2>&1 && DS=$(echo ${DS_PARTITIONS:-parameters} | wc -w)
: > $R/bench.jsonl
bench() {  # $1 = schedule
  local s=$1 t=$(( $(left) - DS * DS_RESERVE ))
  [ $t -gt ${PIPE_TIMEOUT:-150} ] && t=${PIPE_TIMEOUT:-150}
  if [ $t -lt 40 ]; then echo "bench $s skipped: $(left) s left ($(( DS * DS_RESERVE )) s kept for DeepSpeed)"; return; fi
  local log=$R/bench_${s/:/_w}.log  # zb-h1:0 -> bench_zb-h1_w0.log
  timeout -k 10 $t $Z launch -n 2 -- $B/bench_pipe_bubble --device cuda --model $MODEL --dtype bf16 \
    --micro-batch $MB --seq $SEQ --micro-batches $M --batches $BATCHES --warmup 2 --schedules $s ${PARTITION:+--partition $PARTITION} \
    > $log 2>&1
  echo "bench $s rc=$? ($t s limit)"; grep -aiE "error|what\(\)|out of memory|autograd pass" $log | head -3
  grep -ao '{"bench".*' $log | sed "s/^{/{\"partition\": \"${PARTITION:-default}\", /" >> $R/bench.jsonl
}
for s in ${SCHEDULES:-1f1b zb-h1 interleaved gpipe}; do
  bench $s
  if [ $s = zb-h1 ]; then for k in ${ZB_MAX_PENDING:-}; do bench zb-h1:$k; done; fi
done
if [ $DS -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE .whl/*.whl > $R/pip.log 2>&1
  for dp in ${DS_PARTITIONS:-parameters}; do  # PipelineModule's partition_method, one run each
    t=$(( $(left) - 5 )); [ $t -gt ${DS_TIMEOUT:-240} ] && t=${DS_TIMEOUT:-240}
    if [ $t -lt 60 ]; then echo "deepspeed ($dp) skipped: $(left) s left"; continue; fi
    f=$R/deepspeed_pipe_${dp//[^a-zA-Z0-9]/_}
    PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} timeout -k 10 $t torchrun --standalone --nproc_per_node 2 \
      bench/anchors/ds_pipe_anchor.py --model $MODEL --micro-batch $MB --seq $SEQ --micro-batches $M --steps $BATCHES \
      --warmup 2 --partition "$dp" --out $f.json > $f.log 2>&1
    echo "deepspeed pipe ($dp) rc=$? ($t s limit)"; [ -s $f.json ] || grep -av "^\s*$" $f.log | tail -6
  done
fi
python3 - "$R" "$MODEL" "$MB" "$SEQ" "$M" <<'PY'
import json, os, sys
R, model, mb, seq, m = sys.argv[1:]
gib = lambda ps: ", ".join("-" if p is None else f"{p:.1f}" for p in ps or [])
import glob
rows = [json.loads(l) for l in open(f"{R}/bench.jsonl") if l.strip()]
dss = [json.load(open(f)) for f in sorted(glob.glob(f"{R}/deepspeed_pipe*.json"))]
ok = [d for d in dss if d.get("status") == "ok"]
ds = min(ok, key=lambda d: d["ms_per_iter"]) if ok else {}
dms = ds.get("ms_per_iter")  # the fastest DeepSpeed row is the one every ratio is against
print(f"{model}, bf16, pp 2, micro-batch {mb} x seq {seq}, {m} micro-batches; device: {' / '.join(open(f'{R}/device.txt').read().split(chr(10))).strip(' /')}")
print("| run | ms/batch | tokens/s | last stage F / B / W ms | bubble (formula; simulated on each stage's times) | peak GiB per stage (engine phases only) | loss | DeepSpeed / this |")
print("|---|---|---|---|---|---|---|---|")
for r in rows:
    t = r.get("last_stage_ms", {})
    ratio = f"{dms / r['ms_per_batch']:.2f}x" if dms else "-"
    name = r["schedule"] + (f" (v {r['virtual_stages']})" if r.get("virtual_stages", 1) > 1 else "") + \
        (f" (zb_max_pending_w {r['zb_max_pending_w']})" if r.get("zb_max_pending_w", -1) >= 0 else "") + \
        f", partition {r.get('partition', 'default')}"
    print(f"| {name} | {r['ms_per_batch']:.1f} | {r['tokens_per_s']:.0f} | {t.get('F', 0):.1f} / {t.get('B', 0):.1f} / "
          f"{t.get('W', 0):.1f} | {r['bubble_measured']:.3f} ({r['bubble_formula']:.3f}; {r.get('bubble_simulated_per_stage', float('nan')):.3f}) | "
          f"{gib(r['peak_gib_per_stage'])} ({gib(r.get('phase_peak_gib_per_stage'))}) | {r.get('loss_last', 0):.4f} | {ratio} |")
for d in ok:
    print(f"| DeepSpeed PipelineEngine (1F1B, partition {d.get('partition', 'parameters')}, layers {d.get('parts')}) | "
          f"{d['ms_per_iter']:.1f} | {d['tokens_per_s']:.0f} | - | - | {gib(d['peak_gib_per_stage'])} | "
          f"{d.get('loss_last', 0):.4f} | {dms / d['ms_per_iter']:.2f}x |")
for d in dss:
    if d.get("status") != "ok": print("DeepSpeed:", d)
PY
tar -czf $OUT/$NAME.tar.gz -C $OUT $NAME && rm -rf $R
echo "total: $(( $(date +%s) - T0 )) s"
