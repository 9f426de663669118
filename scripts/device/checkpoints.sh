#!/usr/bin/env bash
# Device run CHECKPOINTS (2 GPUs): save, load, stall and convert.
#  1. GPT-2 Large, ZeRO-2 bf16, 2 ranks: save time, load time, checkpoint size (synchronous
#     save: the training stall equals the save time), and a resume to step 6.
#  1b. GPT-2 Large training stall per save, synchronous vs --save-async (snapshot to pinned
#     host memory, background writer): 8 steps, a save every 3 steps and one at the end;
#     stall/write/publish ms per save and the step times while the writer runs.
#  2. `zerotrain convert` of a GPT-2 (124M) checkpoint -> transformers GPT2LMHeadModel
#     logits vs ours on the converted file, and the converted tensors vs the raw consolidation.
#  3. the CPU checkpoint tests (dist at 2 ranks) on this host.
# Results: $OUT/ckpt_results.tar.gz; a short table last.
set -uo pipefail
source scripts/device/common.sh ckpt zerotrain_cli gpt2_logits zt_dist
WORK=${CKPT_WORK:-/tmp/zt_ckpt_work}; rm -rf $WORK; mkdir -p $WORK
cat $R/device.txt

# 1. GPT-2 Large save / load.
L="--model gpt2-large --seq 1024 --micro-batch 4 --warmup 1"
timeout 400 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z2.json $L --steps 3 --save $WORK/large > $R/large_save.txt 2>&1; tail -4 $R/large_save.txt
du -sb $WORK/large/global_step3 > $R/large_size.txt 2>&1; cat $R/large_size.txt
ls -la $WORK/large/global_step3 >> $R/large_size.txt 2>&1
timeout 400 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z2.json $L --steps 6 --load $WORK/large > $R/large_load.txt 2>&1; grep -E "checkpoint load|resuming|Step" $R/large_load.txt | head -8
# Cross world: the 2-rank checkpoint on 1 GPU at stage 1.
CUDA_VISIBLE_DEVICES=0 timeout 300 $Z launch -n 1 -- $Z train --config bench/configs/gpt2_bf16_z1.json $L --steps 4 --load $WORK/large > $R/large_load_1gpu.txt 2>&1; grep -E "checkpoint load|loaded|Step" $R/large_load_1gpu.txt | head -4
rm -rf $WORK/large

# 1b. Stall per save, sync vs async (--summary holds checkpoint_saves: stall_ms, write_ms, ...).
for mode in sync async; do
  flag=""; [ $mode = async ] && flag="--save-async"
  rm -rf $WORK/stall_$mode
  timeout 500 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z2.json $L --steps 8 --print-every 1 \
    --save $WORK/stall_$mode --save-every 3 $flag --summary $R/stall_$mode.json > $R/stall_$mode.txt 2>&1
  grep -E "checkpoint|Step" $R/stall_$mode.txt | head -20
  rm -rf $WORK/stall_$mode
done
python3 - $R > $R/stall_table.txt 2>&1 <<'PY'
import json, sys
r = sys.argv[1]
for mode in ("sync", "async"):
    try:
        s = json.loads(open(f"{r}/stall_{mode}.json").read().splitlines()[-1])
    except Exception as e:
        print(mode, "no summary:", e); continue
    for c in s.get("checkpoint_saves", []):
        print(f"{mode:5s} {c['tag']:14s} stall {c['stall_ms']:9.1f} ms (snapshot {c['snapshot_ms']:.1f}, wait {c['wait_ms']:.1f})"
              f"  write {c['write_ms']:9.1f} ms  publish {c['publish_ms']:7.1f} ms  published at step {c['published_step']}"
              f"  {c['bytes'] / 2**30:.2f} GiB")
    print(f"{mode:5s} ms/iter {s['ms_per_iter']:.1f}")
PY
cat $R/stall_table.txt

# 2. convert -> transformers.
S="--model gpt2 --seq 256 --micro-batch 4 --warmup 1"
timeout 200 $Z launch -n 2 -- $Z train --config bench/configs/gpt2_bf16_z2.json $S --steps 3 --save $WORK/small > $R/small_save.txt 2>&1; tail -2 $R/small_save.txt
$Z convert $WORK/small $WORK/hf/model.safetensors --dtype fp32 > $R/convert.txt 2>&1
$Z convert $WORK/small $WORK/raw.safetensors --raw >> $R/convert.txt 2>&1; cat $R/convert.txt
timeout 200 python3 - "$B/gpt2_logits" "$WORK" > $R/convert_check.txt 2>&1 <<'PY'
import json, subprocess, sys, torch
from safetensors.torch import load_file, save_file
from transformers import GPT2LMHeadModel
binary, work = sys.argv[1], sys.argv[2]
raw, hf = load_file(work + "/raw.safetensors"), load_file(work + "/hf/model.safetensors")
conv = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
tensor_diff = 0.0
for k, v in raw.items():
    h = hf["transformer." + k]
    if k.endswith(conv): h = h.t()
    tensor_diff = max(tensor_diff, (h - v).abs().max().item())
torch.backends.cuda.matmul.allow_tf32 = False
m = GPT2LMHeadModel.from_pretrained(work + "/hf").cuda().eval()
ids = torch.randint(0, 50257, (2, 128))
save_file({"input_ids": ids}, work + "/tokens.safetensors")
with torch.no_grad():
    theirs = m(ids.cuda()).logits.float().cpu()
subprocess.run([binary, work + "/hf", work + "/tokens.safetensors", work + "/ours.safetensors", "--device", "cuda", "--dtype", "fp32"], check=True)
ours = load_file(work + "/ours.safetensors")["logits"].float()
d = (ours - theirs).abs().max().item()
print(json.dumps({"check": "convert_logits", "max_abs_logit_diff": d, "raw_vs_hf_tensor_diff": tensor_diff, "ok": d <= 1e-3 and tensor_diff == 0}))
PY
tail -3 $R/convert_check.txt

# 3. CPU checkpoint tests at 2 ranks.
timeout 300 $Z launch -n 2 -- $B/zt_dist --gtest_filter='Checkpoint*' > $R/dist_ckpt.txt 2>&1; tail -4 $R/dist_ckpt.txt
rm -rf $WORK

echo "total: $(( $(date +%s) - T0 )) s"
tar -czf $OUT/ckpt_results.tar.gz -C $OUT ckpt
echo "---- summary ----"
printf "%-28s %s\n" "device" "$(tail -1 $R/device.txt)"
printf "%-28s %s\n" "large save (2 ranks, z2)" "$(grep -h 'checkpoint save' $R/large_save.txt | tail -1 | sed 's/.*save: //')"
printf "%-28s %s\n" "large size (bytes)" "$(head -1 $R/large_size.txt | cut -f1)"
printf "%-28s %s\n" "large load (2 ranks, z2)" "$(grep -h 'checkpoint load' $R/large_load.txt | tail -1 | sed 's/.*load: //')"
printf "%-28s %s\n" "large load (1 rank, z1)" "$(grep -h 'checkpoint load' $R/large_load_1gpu.txt | tail -1 | sed 's/.*load: //')"
printf "%-28s %s\n" "large stall sync (max ms)" "$(grep '^sync ' $R/stall_table.txt | grep -o 'stall *[0-9.]*' | awk '{print $2}' | sort -n | tail -1)"
printf "%-28s %s\n" "large stall async (max ms)" "$(grep '^async ' $R/stall_table.txt | grep -o 'stall *[0-9.]*' | awk '{print $2}' | sort -n | tail -1)"
printf "%-28s %s\n" "convert -> transformers" "$(tail -1 $R/convert_check.txt)"
printf "%-28s %s\n" "dist Checkpoint* (2 ranks)" "$(grep -hE 'PASSED|FAILED' $R/dist_ckpt.txt | head -2 | tr '\n' ' ')"
