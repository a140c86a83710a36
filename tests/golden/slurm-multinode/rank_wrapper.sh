#!/usr/bin/env bash
# orch rank wrapper for job pp-h100 (rendered by orch 0.1.0; do not edit).
# torchrun starts this once per rank (--no-python) with the training command as "$@".
# Profiled ranks run under `nsys profile`; every other rank execs the command directly,
# so unprofiled ranks pay nothing.
set -euo pipefail

rank=${RANK:?RANK is not set: run this script under torchrun}

# in_ranks R LO HI [LO HI ...]: is R inside one of the inclusive ranges?
in_ranks() {
  local r=$1
  shift
  while [ "$#" -ge 2 ]; do
    if [ "$r" -ge "$1" ] && [ "$r" -le "$2" ]; then return 0; fi
    shift 2
  done
  return 1
}

# Profiled ranks: 0,8,16,24
if ! in_ranks "$rank" 0 0 8 8 16 16 24 24; then
  exec "$@"
fi

nsys_args=( '--trace=cuda,nvtx,osrt,nccl' --sample=none --cpuctxsw=none --capture-range=nvtx '--nvtx-capture=step 3' --capture-range-end=stop --force-overwrite=true)
# One GPU-metrics collector per node (the node's lowest profiled rank): 0,8,16,24
if in_ranks "$rank" 0 0 8 8 16 16 24 24; then
  nsys_args+=( --gpu-metrics-devices=all --gpu-metrics-set=gh100 --gpu-metrics-frequency=10000)
fi
# nsys matches non-registered NVTX strings only with this set.
export NSYS_NVTX_PROFILER_REGISTER_ONLY=0
mkdir -p /orch/run/reports
exec /opt/nvidia/nsight-systems/2025.3.1/bin/nsys profile "${nsys_args[@]}" -o '/orch/run/reports/pp-h100_%q{ORCH_JOB_ID}_r%q{RANK}_%h.%p' "$@"
