#!/usr/bin/env bash
# Device run SUITE_1GPU (one GPU, 16 cores): the whole test suite of this tree as CI runs it,
# built once on the device's cores -- zt_unit (GPU hidden), zt_dist at 1, 2 and 4 CPU ranks,
# and zt_gpu on the GPU -- then a short table. FILTER_DIST narrows zt_dist (default: all).
# Results: $OUT/suite/*.txt.
set -uo pipefail
source scripts/device/common.sh suite zerotrain_cli zt_unit zt_dist zt_gpu
row() { printf "| %-10s | %-6s | %s |\n" "$1" "$2" "$3"; }
count() { grep -E "\[  (PASSED|FAILED) " "$1" | head -2 | tr '\n' ' '; grep -cE "^(\[rank 0\] )?\[  FAILED  \] [A-Za-z]" "$1" | sed 's/^/failed lines: /'; }
( export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=2
  timeout 400 $B/zt_unit > $R/unit.txt 2>&1; echo "unit $?" > $R/unit.rc ) &
( export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1
  for n in 1 2 4; do timeout 300 $Z launch -n $n -- $B/zt_dist --gtest_filter="${FILTER_DIST:-*}" > $R/dist$n.txt 2>&1; echo "dist$n $?" > $R/dist$n.rc; done ) &
timeout 200 $B/zt_gpu > $R/gpu.txt 2>&1; echo "gpu $?" > $R/gpu.rc
wait
echo "| suite | rc | result |"; echo "|---|---|---|"
for s in unit dist1 dist2 dist4 gpu; do row $s "$(cut -d' ' -f2 $R/$s.rc)" "$(count $R/$s.txt)"; done
grep -hE "FAILED  \] [A-Za-z]" $R/*.txt | sort -u | head -20
echo "total: $(( $(date +%s) - T0 )) s"
