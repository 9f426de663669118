# Sourced by the Llama-3.2-1B base/new device scripts (call18_4gpu.sh, call19_4gpu.sh,
# verify18_2gpu.sh). base_build_start: unpacks .base/base.tar.gz into /tmp/base and builds its
# zerotrain_cli in the background (`wait` for it after common.sh's build). l1b_row GPU LABEL TAG
# [MIN_LEFT]: one Llama-3.2-1B row (bench/configs/llama_bf16_z0.json, bf16, ZeRO-0, mb 4, seq 2048,
# 18 steps after 3, --summary $R/l1b-TAG-LABEL.json) of the baseline (LABEL base) or this tree
# (new) on GPU, skipped unless MIN_LEFT (default 45) seconds are left before DEADLINE; needs $Z,
# $R, $T0 and $DEADLINE (common.sh and the caller set them). The table: l1b_ab_table.py.
base_build_start() {
  mkdir -p /tmp/base && tar -xzf .base/base.tar.gz -C /tmp/base || return 1
  ( cd /tmp/base && cmake -S . -B build-gpu -G Ninja -DZT_PYTHON=python3 -DZT_WERROR=OFF > /tmp/base_cmake.log 2>&1 \
    && ninja -C build-gpu zerotrain_cli > /tmp/base_build.log 2>&1; echo "baseline build rc=$?" ) &
}
left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
l1b_row() {
  local g=$1 v=$2 tag=$3 min=${4:-45} Zv=$Z
  [ $v = base ] && Zv=/tmp/base/build-gpu/zerotrain
  [ $(left) -gt $min ] || { echo "1B $tag ($v) on GPU $g: skipped (deadline)"; return; }
  CUDA_VISIBLE_DEVICES=$g timeout 60 $Zv train --config bench/configs/llama_bf16_z0.json \
    --model llama3.2-1b --seq 2048 --micro-batch 4 --steps 18 --warmup 3 --device cuda --summary $R/l1b-$tag-$v.json \
    > $R/l1b-$tag-$v.log 2>&1
}
