#!/usr/bin/env bash
# Device run SANITIZE_CPU (the 16 cores; the GPU hidden): the CPU test suite built with
# AddressSanitizer + UndefinedBehaviorSanitizer (ZT_SANITIZE=address,undefined, the build CI
# makes) and run as CI runs it. PHASE=build|unit|dist|all (default all): the build persists
# in build-san while the machine stays warm. CPU seconds per phase (user+sys) are what the
# 2-core CI machine pays; the build is CI's (unity, -Werror). Results: $OUT/sanitize/*.txt.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 CUDA_VISIBLE_DEVICES=
# SAN=none builds and runs the same suite without sanitizers (build-cpu), for the ratio.
SAN=${SAN:-address,undefined}
PHASE=${PHASE:-all}
if [ "$SAN" = none ]; then B=build-cpu; SANFLAG=""; R=${OUT:-/tmp/out}/plain
else B=build-san; SANFLAG="-DZT_SANITIZE=$SAN"; R=${OUT:-/tmp/out}/sanitize; set -a; source cmake/sanitize.env; set +a; fi
mkdir -p $R; Z=$B/zerotrain
T=/usr/bin/time; [ -x $T ] || T=""
if [ $PHASE = build ] || [ $PHASE = all ]; then
  T0=$(date +%s)
  [ -f $B/build.ninja ] || cmake -S . -B $B -G Ninja -DZT_PYTHON=python3 -DZT_CUDA=OFF \
      $SANFLAG > $R/cmake.log 2>&1 || { tail -30 $R/cmake.log; exit 1; }
  ninja -C $B zerotrain_cli zerotrain_rank zt_unit zt_dist > $R/build.log 2>&1 || { grep -E "error" $R/build.log | head -30; exit 1; }
  echo "build wall: $(( $(date +%s) - T0 )) s"
  # CPU seconds of the compile jobs (the ninja log's per-job wall at -j16 ~ one core each).
  awk 'NR>1{s+=($2-$1)/1000; n++} END{printf "build jobs: %d, job-seconds: %.0f\n", n, s}' $B/.ninja_log
fi
run() {  # NAME CMD...
  local name=$1; shift; local t0=$(date +%s)
  ( /usr/bin/time -f "%U %S" -o $R/$name.cpu "$@" > $R/$name.txt 2>&1; echo $? > $R/$name.rc )
  echo "$name wall $(( $(date +%s) - t0 )) s" > $R/$name.wall
}
if [ $PHASE = unit ] || [ $PHASE = all ]; then
  OMP_NUM_THREADS=1 run unit timeout 580 $B/zt_unit &
fi
if [ $PHASE = dist ] || [ $PHASE = all ]; then
  for n in 1 2 4; do OMP_NUM_THREADS=1 run dist$n timeout 580 $Z launch -n $n -- $B/zt_dist & done
  OMP_NUM_THREADS=1 run consumer bash -c "cd $B && ctest -R 'install_consumer|docs_links' --output-on-failure" &
fi
wait
echo "| suite | rc | passed/failed | wall | cpu user sys |"; echo "|---|---|---|---|---|"
for s in unit dist1 dist2 dist4 consumer; do
  [ -f $R/$s.rc ] || continue
  echo "| $s | $(cat $R/$s.rc) | $(grep -E "\[  (PASSED|FAILED) " $R/$s.txt | head -2 | tr '\n' ' ') | $(cut -d' ' -f3 $R/$s.wall) | $(cat $R/$s.cpu 2>/dev/null | tail -1) |"
done
grep -hE "FAILED  \] [A-Za-z]|ERROR: AddressSanitizer|runtime error:" $R/*.txt | sort | uniq -c | head -30
