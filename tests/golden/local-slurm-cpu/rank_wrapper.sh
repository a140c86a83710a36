#!/usr/bin/env bash
# orch rank wrapper for job ddp-slurm-cpu (rendered by orch 0.1.0; do not edit).
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

# Profiled ranks: 0,3
if ! in_ranks "$rank" 0 0 3 3; then
  exec "$@"
fi

nsys_args=( '--trace=nvtx,osrt' --sample=none --cpuctxsw=none --force-overwrite=true)
mkdir -p /orch/run/reports
exec nsys profile "${nsys_args[@]}" -o '/orch/run/reports/ddp-slurm-cpu_%q{ORCH_JOB_ID}_r%q{RANK}_%h.%p' "$@"
