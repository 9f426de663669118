#!/usr/bin/env bash
# Issue 18's CPU bubble: bench_pipe_bubble at pp 2, 8 micro-batches, one rank per core
# (OMP_NUM_THREADS=1, 2 ranks), every schedule; one JSON line per schedule on stdout.
# On a machine others share, the ranks get their own scheduler group at the highest
# priority (Linux autogroup nice -20; needs root, else it runs without and says so) and the
# bench repeats its timed batches while other processes took more than 0.1 CPU core
# (--max-other-load, up to 3 rounds; "other_processes_cpu_cores" in each line). MPI's
# shared-memory transport uses single-copy (CMA) here unless the environment says otherwise:
# zerotrain defaults to none (containers often forbid CMA, and CMA corrupts the receiver's
# heap on a message longer than its buffer, docs/comm.md), whose copy-in/copy-out
# moves a large message only while both ranks are inside MPI and so puts its latency on the
# schedule's critical path; set OMPI_MCA_btl_vader_single_copy_mechanism=none to measure that.
#   usage: scripts/pipe_bubble_cpu.sh [BUILD_DIR] [extra bench_pipe_bubble flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build}"; shift || true
if [ -z "${ZT_BUBBLE_SESSION:-}" ]; then
  # A new session is a new autogroup: its nice value weighs the ranks against other sessions.
  exec setsid -w env ZT_BUBBLE_SESSION=1 "$0" "$BUILD" "$@"
fi
if ! { echo -20 > /proc/self/autogroup; } 2>/dev/null; then
  echo "pipe_bubble_cpu: could not raise the scheduler group's priority (not root, or no autogroup)" >&2
fi
export OMP_NUM_THREADS=1
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-cma}"
NICE=(); nice -n -20 true 2>/dev/null && NICE=(nice -n -20)
exec "${NICE[@]}" "$BUILD/zerotrain" launch -n 2 -- "$BUILD/bench_pipe_bubble" --micro-batches 8 --batches 5 \
  --max-other-load 0.1 --attempts 3 "$@"
