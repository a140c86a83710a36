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

# nsys can fail while it starts, before the program runs: when several ranks of a node start it
# at the same moment, its agent launch races ("Agent launcher failed", "Local Endpoint is not
# available", "Connection reset by peer"; about 1 start in 30 with nsys 2022.4 on one machine).
# Such an attempt ran nothing, so it is started again. The program's first act is to create a
# marker (a shell builtin: no extra process in the trace), which tells a failed start from a
# program that ran and failed: that one is never run twice. Without a writable marker, no retry.
started=$(mktemp -u "${TMPDIR:-/tmp}/orch-started.XXXXXXXX")
attempts=3
if ! { : > "$started"; } 2>/dev/null; then attempts=1; fi
rm -f "$started"
stop=0
trap 'stop=1' TERM INT HUP  # torchrun and Slurm signal nsys too: let it write its report, then stop
for attempt in $(seq 1 "$attempts"); do
  rc=0
  # shellcheck disable=SC2016 # the inner sh expands them
  ORCH_STARTED=$started /opt/nvidia/nsight-systems/2025.3.1/bin/nsys profile "${nsys_args[@]}" -o '/orch/run/reports/pp-h100_%q{ORCH_JOB_ID}_r%q{RANK}_%h.%p' \
    /bin/sh -c ': > "$ORCH_STARTED" 2>/dev/null; unset ORCH_STARTED; exec "$@"' orch-rank "$@" || rc=$?
  ran=0
  if [ -e "$started" ]; then ran=1; fi
  rm -f "$started"
  if [ "$rc" -eq 0 ] || [ "$ran" -eq 1 ] || [ "$stop" -eq 1 ]; then
    exit "$rc"
  fi
  if [ "$attempt" -lt "$attempts" ]; then
    echo "orch: rank $rank: nsys exited with status $rc before the program started" \
         "(attempt $attempt of $attempts); starting it again" >&2
    sleep "$(( attempt + RANDOM % 3 ))"
    if [ "$stop" -eq 1 ]; then exit "$rc"; fi
  fi
done
echo "orch: rank $rank: nsys exited with status $rc before the program started, $attempts time(s);" \
     "its own messages are above" >&2
exit "$rc"
