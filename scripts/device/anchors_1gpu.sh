#!/usr/bin/env bash
# Device run ANCHORS_1GPU (one GPU): GPT-2 Large, bf16, micro-batch 8, seq 1024: zerotrain's
# stages 0-3 and the CPU-offload rows next to the torch.compile'd model and DeepSpeed 0.19.8
# (carried as wheels in .whl/) at the same stage and offload, in the same call.
#   ONLY=... the rows (default z0..z3 bf16 + z2-offopt); SET=... the anchor kinds.
# Results: $OUT/anchors_1gpu.tar.gz.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
source scripts/device/common.sh anchors_1gpu zerotrain_cli
python3 -c "import deepspeed; print('deepspeed', deepspeed.__version__)" 2>&1 | tail -1
$Z bench --model gpt2-large --gpus 1 --steps ${STEPS:-12} --warmup 3 --with-anchors --anchor-set ${SET:-compile,deepspeed} \
  --timeout 240 --python python3 --only ${ONLY:-z0-bf16,z1-bf16,z2-bf16,z3-bf16,z2-offopt} --out $R/gpt2-large > $R/bench.log 2>&1
grep "^\[bench\]" $R/bench.log | cut -c1-150
for f in $R/gpt2-large/logs/deepspeed-*.log $R/gpt2-large/logs/torch-compile.log; do
  [ -f "$f" ] && ! grep -q '"status": "ok"' "$f" && { echo "== $f"; grep -v "^\s*$" "$f" | tail -8; }
done
tar -czf $OUT/anchors_1gpu.tar.gz -C $OUT anchors_1gpu
echo "total: $(( $(date +%s) - T0 )) s"
