#!/usr/bin/env bash
# Device run CAPACITY_FSDP2 (1 GPU of the 2-GPU host): the largest GPT-2-shaped model that PyTorch
# FSDP2 + CPUOffloadPolicy(pin_memory) trains on ONE GPU, in the shape of the zerotrain capacity
# runs (bench/results/2026-11-22_capacity_h200: width 4096, 32 heads, vocab 50257, micro-batch 1,
# seq 1024, activation checkpointing, bf16, AdamW, 3 steps).  The model is built on the meta
# device, sharded, materialized on the CPU (to_empty) and initialized there (--meta-init), so no
# full unsharded copy is ever on the GPU.  Needs only python3/torchrun with torch 2.11 (no build).
# Usage: LAYERS="44 59 68" T=200 GUARD=4 bash scripts/device/capacity_fsdp2.sh
#   LAYERS  layer counts to try, in order (default "44 59 68")
#   T       per-run timeout in seconds (default 200); keep count(LAYERS) * T under the call's limit
#   GUARD   --host-mem-guard-gib: report a host OOM and exit when less than GUARD GiB of host memory
#           is available, rather than being SIGKILLed by the kernel (default 4; 0 = record only)
set -uo pipefail
source scripts/device/common.sh cap_fsdp2 --no-build
export CUDA_VISIBLE_DEVICES=0
J=$R/cap_fsdp2.jsonl
LAYERS=${LAYERS:-"44 59 68"}; T=${T:-200}; GUARD=${GUARD:-4}
t0=$T0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > $R/device.txt 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> $R/device.txt 2>&1
cat $R/device.txt
{ echo "== before"; free -g; } > $R/host.txt; free -g | head -2
n=0; for l in $LAYERS; do n=$((n + 1)); done
[ $((n * T)) -le 560 ] || echo "warning: $n runs x T=$T s may exceed one device call's 600 s"

summary() {  # layers rc log lines_before: one line from the run's JSON record (or why there is none)
  python3 - "$@" "$J" <<'EOF'
import json, os, re, sys
layers, rc, log, before, path = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5]
recs = []
if os.path.exists(path):
    with open(path) as f:
        recs = [json.loads(l) for l in f if l.strip()]
new = recs[before:]
if not new:
    text = open(log, errors="replace").read() if os.path.exists(log) else ""
    if rc in (124, 137):
        why = f"timeout (rc {rc})"
    elif re.search(r"SIGKILL|exitcode\s*:\s*-9|Killed", text):
        why = "killed (SIGKILL: host OOM killer?)"
    else:
        err = [l for l in text.splitlines() if re.search(r"Error|error:|out of memory", l)]
        why = f"failed rc {rc}: " + (err[-1].strip()[:200] if err else "no result line")
    print(f"layers={layers} params=? status={why}")
    sys.exit(0)
r = new[-1]
g = lambda k: r.get(k)
s = f"layers={g('layers')} params={g('n_params') / 1e9:.2f}B status={g('status')}"
if g("status") == "oom":
    s += f" phase={g('phase')} kind={g('oom_kind')} iter={g('oom_iteration')} err={(g('error') or '')[:160]!r}"
else:
    pm = g("phase_mem_gib") or {}
    pk = " / ".join(f"{(pm.get(p) or {}).get('peak') or 0:.1f}" for p in ("forward", "backward", "step"))
    ph = g("phase_ms") or {}
    s += (f" ms/iter={g('ms_per_iter'):.0f} (fwd {ph.get('forward', 0):.0f} bwd {ph.get('backward', 0):.0f}"
          f" step {ph.get('step', 0):.0f}) gpu_peak={g('peak_gib')} GiB (fwd/bwd/step {pk})"
          f" reserved={g('peak_reserved_gib')} host_rss_peak={g('host_peak_rss_gib')} GiB"
          f" host_min_avail={g('host_min_avail_gib')} GiB")
mi = g("meta_init_info") or {}
if mi:
    s += f" materialize={mi.get('materialize_s')}s init={mi.get('init_s')}s"
s += f" rc={rc}"
print(s)
EOF
}

for l in $LAYERS; do
  log=$R/log_L$l.txt
  before=$( [ -f $J ] && grep -c . $J || echo 0 )
  ts=$(date +%s)
  timeout -k 30 $T torchrun --standalone --nproc_per_node 1 bench/anchors/train_anchor.py --mode fsdp2_offload \
    --meta-init --checkpoint-activations --model gpt2 --layers $l --embd 4096 --heads 32 --seq 1024 \
    --micro-batch 1 --steps 3 --warmup 1 --dtype bf16 --host-mem-guard-gib $GUARD --json $J > $log 2>&1
  rc=$?
  echo "$(summary $l $rc $log $before) wall=$(( $(date +%s) - ts ))s" | tee -a $R/summary.txt
  { echo "== after L=$l (rc $rc)"; free -g; } >> $R/host.txt
done
echo "total: $(( $(date +%s) - t0 )) s"
cat $R/host.txt
tar -czf $OUT/cap_fsdp2.tar.gz -C $OUT cap_fsdp2
