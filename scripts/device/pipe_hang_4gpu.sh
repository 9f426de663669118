#!/usr/bin/env bash
# Device run PIPE_HANG_4GPU (4 GPUs, one call, ~5 min after the build): issue 25's hang of
# the interleaved 1F1B schedule with ZeRO-2 over dp 2 under NCCL (docs/pipeline.md, "What is
# left"). `zerotrain train` GPT-2 small (MODEL), bf16, pp 2 x dp 2, micro-batch 4 x seq 1024,
# 8 micro-batches, STEPS steps, random tokens, in VARIANTS (each name below; default all, in
# this order, the most telling first), each under RUN_TIMEOUT s, skipping the rest once the
# runs passed BUDGET s or the next could end past LIMIT s from the script's start (build included):
#   base         interleaved (v 2), ZeRO-2                         (expected: hangs)
#   eager        base + ZT_PIPE_EAGER_COMMS=1 ([Pipeline Eager Groups]: every pipeline
#                communicator created and connected in the constructor)   (the candidate fix)
#   fewchannels  base + NCCL_MAX_NCHANNELS=4 NCCL_MAX_P2P_NCHANNELS=4 (the act, grad and dp
#                communicators' kernels, each spinning on a peer, then need 12 SMs, not ~100:
#                rules out SM starvation between concurrent NCCL kernels)
#   noconnect    base + NCCL_RUNTIME_CONNECT=0 (NCCL connects every channel at init)
#   eagerload    base + CUDA_MODULE_LOADING=EAGER (no lazy kernel loading mid-batch; loads all
#                of LibTorch's kernels at start, slow: late in the list)
#   connections  base + CUDA_DEVICE_MAX_CONNECTIONS=32 (no false serialization of streams
#                that share one of the default 8 hardware queues)
#   z1overlap    interleaved, ZeRO-1 with overlap_comm (reduce-scatters from the hooks, in the
#                last micro-step only)
#   nooverlap    base with overlap_comm false (zerotrain's stage 2 reduces in every backward
#                regardless: expected the same as base)
#   control      1f1b, ZeRO-2 (passed on 4 H100s)
#   buckets      base with reduce_bucket_size 2e7 (the default 5e8 makes each stage one bucket
#                holding both chunks, reduce-scattered after autograd returns on the main
#                thread; smaller buckets of one chunk go from the hooks on autograd's thread,
#                as in 1f1b)
#   xl           base on gpt2-xl (the model of the two hangs: 13 MB messages, not 6 MB)
# Every run: ZT_PIPE_ALLOW_INTERLEAVED_ZERO2=1 (lifts the CUDA refusal, logged as a warning),
# ZT_COMM_TIMEOUT (default 15: a stage whose CUDA stream stalls logs where -- "[Pipeline Stall
# Watchdog]" -- after that many seconds and throws after twice that), NCCL_DEBUG=WARN (base:
# INFO for INIT,P2P into per-process files). A run still going DUMP_AT s after its start, or 3 s
# after a watchdog line, gets every rank's stacks (gdb -batch 'thread apply all bt' when gdb is
# there, else /proc/PID/task/*/{comm,wchan,stack}), then is stopped 8 s later. Results: $OUT/pipe_hang_4gpu.tar.gz;
# the table last: variant, rc, hung?, first error line.
set -uo pipefail
source scripts/device/common.sh pipe_hang_4gpu zerotrain_cli
MODEL=${MODEL:-gpt2}; MB=${MB:-4}; SEQ=${SEQ:-1024}; M=${M:-8}; STEPS=${STEPS:-4}
RUN_TIMEOUT=${RUN_TIMEOUT:-70}; DUMP_AT=${DUMP_AT:-50}; BUDGET=${BUDGET:-270}
VARIANTS=${VARIANTS:-"base eager fewchannels noconnect connections z1overlap control buckets eagerload xl nooverlap"}
LIMIT=${LIMIT:-590}  # the call's 600 s: no variant starts unless it can end (RUN_TIMEOUT + 20 s) before
export ZT_COMM_TIMEOUT=${ZT_COMM_TIMEOUT:-15} ZT_PIPE_ALLOW_INTERLEAVED_ZERO2=1
GDB=$(command -v gdb || true); echo "gdb: ${GDB:-none}; $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) x $(nvidia-smi -L | wc -l)"

config() {  # $1 zero stage, $2 schedule, $3 overlap_comm, $4 reduce_bucket_size
  local v=1; [ "$2" = interleaved ] && v=2
  cat <<EOF
{"train_micro_batch_size_per_gpu": $MB, "gradient_accumulation_steps": $M, "steps_per_print": 1,
 "gradient_clipping": 1.0, "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
 "zero_optimization": {"stage": $1, "overlap_comm": $3, "reduce_bucket_size": $4},
 "pipeline": {"stages": 2, "schedule": "$2", "virtual_stages": $v}}
EOF
}

dump_stacks() {  # $1 variant, $2 config path (finds this run's rank processes)
  local pids gpids=(); pids=$(pgrep -f -- "train --config $2" || true)
  for p in $pids; do
    local rank; rank=$(tr '\0' '\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^RANK=//p' | head -1)
    [ -n "$rank" ] || continue  # the launcher, mpirun, timeout: not a rank
    local f=$R/stacks_$1_rank${rank:-x}_pid$p.txt
    # gdb when there (and allowed to attach), else what /proc tells of each thread.
    ( if [ -n "$GDB" ]; then timeout 40 $GDB -batch -nx -p $p -ex 'thread apply all bt' > $f 2>&1; fi
      grep -q '^Thread ' $f 2>/dev/null ||
        for t in /proc/$p/task/*; do echo "== $t $(cat $t/comm) wchan=$(cat $t/wchan 2>/dev/null)"; cat $t/stack 2>/dev/null; done >> $f
    ) &
    gpids+=($!)
  done
  [ ${#gpids[@]} = 0 ] || wait "${gpids[@]}"  # not the run itself
  # One line per rank: the main thread's innermost zerotrain frame and innermost NCCL / CUDA frame.
  for f in $R/stacks_$1_rank*.txt; do
    [ -f "$f" ] || continue
    local main; main=$(awk '/^Thread 1 /{f=1; next} /^Thread [0-9]+ /{f=0} f' "$f" 2>/dev/null)
    [ -n "$main" ] || main=$(cat "$f")
    echo "  $(basename $f .txt): zt: $(echo "$main" | grep -m1 -oE 'zt::[A-Za-z_:]+' ) | nccl/cuda: $(echo "$main" | grep -m1 -oE '(nccl[A-Za-z]+|cu[A-Z][A-Za-z]+|cuda[A-Z][A-Za-z]+)')"
    grep -hoE '(ncclCommInitRank[A-Za-z]*|ncclGroupEnd|ncclTransportP2pSetup|ncclProxyConnect|cuModuleLoad[A-Za-z]*|cuLibraryLoad[A-Za-z]*|cudaEventSynchronize|cuEventSynchronize|cudaDeviceSynchronize|cudaStreamSynchronize)' "$f" | sort | uniq -c | sed 's/^/      /' | head -8
  done
}

declare -A RC HUNG ERR
S0=$(date +%s)
for v in $VARIANTS; do
  if [ $(( $(date +%s) - S0 )) -gt $BUDGET ] || [ $(( $(date +%s) - T0 + RUN_TIMEOUT + 20 )) -gt $LIMIT ]; then
    RC[$v]=-; HUNG[$v]=-; ERR[$v]="skipped (budget: ${BUDGET} s of runs, ${LIMIT} s in all)"; continue
  fi
  z=2; sched=interleaved; ov=true; envs=(); bucket=500000000; model=$MODEL
  case $v in
    base) envs=(NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P "NCCL_DEBUG_FILE=$R/nccl_base.%p.log") ;;
    eager) envs=(ZT_PIPE_EAGER_COMMS=1 NCCL_DEBUG=WARN) ;;
    fewchannels) envs=(NCCL_MAX_NCHANNELS=4 NCCL_MAX_P2P_NCHANNELS=4 NCCL_DEBUG=WARN) ;;
    noconnect) envs=(NCCL_RUNTIME_CONNECT=0 NCCL_DEBUG=WARN) ;;
    eagerload) envs=(CUDA_MODULE_LOADING=EAGER NCCL_DEBUG=WARN) ;;
    connections) envs=(CUDA_DEVICE_MAX_CONNECTIONS=32 NCCL_DEBUG=WARN) ;;
    z1overlap) z=1; envs=(NCCL_DEBUG=WARN) ;;
    nooverlap) ov=false; envs=(NCCL_DEBUG=WARN) ;;
    control) sched=1f1b; envs=(NCCL_DEBUG=WARN) ;;
    buckets) bucket=20000000; envs=(NCCL_DEBUG=WARN) ;;
    xl) model=gpt2-xl; envs=(NCCL_DEBUG=WARN) ;;
    *) echo "unknown variant $v"; continue ;;
  esac
  cfg=$R/cfg_$v.json; config $z $sched $ov $bucket > $cfg
  log=$R/$v.log; t0=$(date +%s)
  env "${envs[@]}" timeout -k 10 $RUN_TIMEOUT $Z launch -n 4 -- $Z train --config $cfg --model $model --pp 2 \
    --seq $SEQ --steps $STEPS --data random --print-every 1 > $log 2>&1 &
  job=$!; dumped=0
  while kill -0 $job 2>/dev/null; do
    sleep 1
    el=$(( $(date +%s) - t0 ))
    if [ $dumped = 0 ] && { [ $el -ge $DUMP_AT ] || grep -q "has not finished the batch" $log; }; then
      [ $el -ge $DUMP_AT ] || sleep 3
      echo "$v: dumping stacks at $(( $(date +%s) - t0 )) s"; dump_stacks $v $cfg; dumped=$(date +%s)
    fi
    # Stacks taken: stop the run (this script's own timeout process; it passes TERM on).
    if [ $dumped != 0 ] && [ $(( $(date +%s) - dumped )) -ge 8 ]; then kill -TERM $job 2>/dev/null; sleep 2; fi
  done
  wait $job; rc=$?
  hung=no
  { [ $rc = 124 ] || [ $rc = 137 ] || [ $dumped != 0 ] || grep -q "has not finished the batch" $log; } && hung=yes
  RC[$v]=$rc; HUNG[$v]=$hung
  ERR[$v]=$(grep -m1 -iE "has not finished the batch|error|what\(\)|timed out|refused|killed" $log | cut -c1-260)
  echo "$v: rc=$rc hung=$hung ($(( $(date +%s) - t0 )) s)"
  grep -E "has not finished the batch" $log | sed 's/^/  /' | cut -c1-400 | head -4
  grep -E "Step [0-9]+" $log | tail -2 | sed 's/^/  /'
  grep -hE "NCCL WARN" $log | head -3 | sed 's/^/  /'
  if [ $v = base ]; then
    for f in $R/nccl_base.*.log; do [ -f "$f" ] && echo "  $(basename $f): $(wc -l < $f) lines, last: $(tail -1 $f | cut -c1-200)"; done
  fi
done

tar -czf $OUT/pipe_hang_4gpu.tar.gz -C $OUT pipe_hang_4gpu
echo
echo "| variant | rc | hung? | first error line |"
echo "|---|---|---|---|"
for v in $VARIANTS; do echo "| $v | ${RC[$v]:-} | ${HUNG[$v]:-} | ${ERR[$v]:-} |"; done
echo "total: $(( $(date +%s) - T0 )) s"
