#!/usr/bin/env bash
# orch per-node launch for job ddp-slurm-cpu (rendered by orch 0.1.0; do not edit).
# Runs once per node: by sbatch.sh (srun, one task per node), by `orch submit` through
# submitit, or by hand on one machine. It starts torchrun over the rank wrapper.
set -euo pipefail
# The stop signals are trapped first thing: one that comes before stop_node below is ready is
# noted, not fatal (bash's default for SIGUSR2 is to end), and acted on once it is. Slurm may
# send --signal up to a minute early, so a short job can be warned as it starts.
early=""
ready=0
# shellcheck disable=SC2317 # called by the traps
on_stop() { if [ "$ready" -eq 1 ]; then stop_node "$1"; else early=${early:-$1}; fi; }
trap 'on_stop "time-limit warning (SIGUSR2)"' USR2
trap 'on_stop "SIGTERM"' TERM
trap 'on_stop "SIGINT"' INT
trap 'on_stop "SIGHUP"' HUP
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The id that names the reports: Slurm's job id, submitit's local job id, or "local".
export ORCH_JOB_ID=${ORCH_JOB_ID:-${SLURM_JOB_ID:-${SUBMITIT_LOCAL_JOB_ID:-local}}}
nnodes=${SLURM_NNODES:-1}
node_rank=${SLURM_NODEID:-0}
if [ "$nnodes" -ne 2 ]; then
  echo "orch: this allocation has $nnodes nodes but the job was rendered for 2" >&2
  exit 2
fi
export GLOO_SOCKET_IFNAME=lo
export OMP_NUM_THREADS=1

rdzv=()
if [ "$nnodes" -eq 1 ] && [ -z "${SLURM_JOB_NODELIST:-}" ]; then
  # One machine, no Slurm: let torchrun pick a free port.
  rdzv=(--standalone)
else
  # Derived from the job id so concurrent jobs on shared nodes do not collide.
  id_digits=${ORCH_JOB_ID//[^0-9]/}
  port=$(( 20000 + ${id_digits:-0} % 20000 ))
fi
if [ "${#rdzv[@]}" -eq 0 ]; then
  if [ -n "${SLURM_JOB_NODELIST:-}" ]; then
    head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
  else
    head_node=127.0.0.1
  fi
  # Static rendezvous: node N holds ranks N*2..., as the manifest expects.
  rdzv=(--node-rank="$node_rank" --master-addr="$head_node" --master-port="$port")
fi
echo "orch: node $node_rank/$nnodes on $(hostname) job $ORCH_JOB_ID: torchrun ${rdzv[*]}" >&2

# How this node stops when the job does not end by itself. The early warning (SIGUSR2, sent
# 90 s before the time limit by Slurm's --signal and by orch's local executor) or a cancel
# (SIGTERM) is turned into one SIGTERM to torchrun, which passes it to every rank wrapper; a
# profiled rank's wrapper asks its nsys to stop (nsys keeps the program's NVTX ranges, ends the
# program and writes the report). Below torchrun SIGUSR2 is ignored, so Slurm's signal to every
# process of the step reaches no program. Then each nsys of this node gets up to 60 s to
# finish its report (profile.stop_grace_s) before it is killed and named here.
export ORCH_STOP_GRACE_S=60
export ORCH_RELEASE_WAIT_S=${ORCH_RELEASE_WAIT_S:-10}
# A profiled program that finished but has not exited this long after is ended (profile.exit_grace_s).
export ORCH_EXIT_GRACE_S=120
export ORCH_CTL_DIR=/orch/run/logs/.orch-$ORCH_JOB_ID-n$node_rank
mkdir -p "$ORCH_CTL_DIR"

# Hang evidence, under the run directory: PyTorch's Flight Recorder (the last collectives of
# every process group, dumped per rank by the NCCL watchdog when a collective times out; the
# TORCH_NCCL_* names are the older spellings of the TORCH_FR_* ones) and, on a stop, a stack
# dump of every rank's Python threads (pyhooks/sitecustomize.py). Values set above win.
export ORCH_DUMP_DIR=/orch/run/dumps
mkdir -p "$ORCH_DUMP_DIR/flight_recorder"
export TORCH_FR_BUFFER_SIZE=${TORCH_FR_BUFFER_SIZE:-${TORCH_NCCL_TRACE_BUFFER_SIZE:-2000}}
export TORCH_NCCL_TRACE_BUFFER_SIZE=${TORCH_NCCL_TRACE_BUFFER_SIZE:-$TORCH_FR_BUFFER_SIZE}
export TORCH_NCCL_DUMP_ON_TIMEOUT=${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}
# A collective that times out: NCCL's watchdog aborts the communicators and the rank's program
# ends on the resulting exception (2, "clean up only"), instead of PyTorch's default (3) of
# killing the process with SIGABRT, which ends nsys' capture before CUPTI handed over the GPU's
# records: the rank's kernels are kept, and the hook dumps its Flight Recorder on the way out.
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-2}
export TORCH_FR_DUMP_TEMP_FILE=${TORCH_FR_DUMP_TEMP_FILE:-$ORCH_DUMP_DIR/flight_recorder/rank_}
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE=${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$TORCH_FR_DUMP_TEMP_FILE}
export PYTHONPATH="$here/pyhooks${PYTHONPATH:+:$PYTHONPATH}"

stopping=""
torchrun_pid=""
# running PID: is PID a live process? A program that ended is a zombie until its parent (nsys)
# reaps it, which nsys does only once it wrote the report: it is not running.
running() {
  local st
  [ -n "$1" ] && st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st:0:1}" != Z ]
}
# shellcheck disable=SC2317 # called by the traps (on_stop)
stop_node() {
  if [ -n "$stopping" ]; then return 0; fi
  stopping=$1
  echo "orch: node $node_rank: $1: stack dumps, then stopping the captures, then the ranks" >&2
  local f app r waited=0 left=1
  for f in "$ORCH_CTL_DIR"/app.r*.pid; do
    if [ -s "$f" ]; then kill -WINCH "$(cat "$f")" 2>/dev/null || true; fi
  done
  # Each rank's hook dumps, then releases its GPU (aborts its NCCL groups, so a kernel waiting
  # for a peer ends and CUPTI can hand its records to nsys) and writes released.r<RANK>. The
  # captures are stopped once every live program has, or after ORCH_RELEASE_WAIT_S.
  sleep 0.2 || true
  while [ "$left" -eq 1 ] && [ "$waited" -lt $(( ORCH_RELEASE_WAIT_S * 10 )) ]; do
    left=0
    for f in "$ORCH_CTL_DIR"/app.r*.pid; do
      [ -s "$f" ] || continue
      app=$(cat "$f" 2>/dev/null || true)
      r=${f##*/app.r}
      r=${r%.pid}
      if running "$app" && [ ! -e "$ORCH_CTL_DIR/released.r$r" ]; then left=1; fi
    done
    if [ "$left" -eq 1 ]; then sleep 0.1 || true; waited=$((waited + 1)); fi
  done
  if [ -n "$torchrun_pid" ]; then kill -TERM "$torchrun_pid" 2>/dev/null || true; fi
}
ready=1
if [ -n "$early" ]; then stop_node "$early"; fi
(
  trap '' USR2
  exec python3 -m torch.distributed.run --nnodes="$nnodes" --nproc-per-node=2 \
    --max-restarts=0 "${rdzv[@]}" --no-python "$here/rank_wrapper.sh" python3 -u <REPO>/scripts/examples/train.py --steps 5
) &
torchrun_pid=$!
if [ -n "$stopping" ]; then kill -TERM "$torchrun_pid" 2>/dev/null || true; fi
while kill -0 "$torchrun_pid" 2>/dev/null; do wait "$torchrun_pid" || true; done
rc=0
wait "$torchrun_pid" || rc=$?

# Each profiled rank's wrapper left its nsys' pid (and its program's) in $ORCH_CTL_DIR until
# its report was made. A wrapper torchrun killed leaves them behind: wait for that nsys, kill it
# once the grace is over, and make the report from its raw stream (keep_report.sh).
deadline=$((SECONDS + ORCH_STOP_GRACE_S))
for f in "$ORCH_CTL_DIR"/nsys.r*.pid; do
  [ -e "$f" ] || continue
  pid=$(cat "$f" 2>/dev/null || true)
  r=${f##*/nsys.r}
  r=${r%.pid}
  while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5 || true; done
  app=$(cat "$ORCH_CTL_DIR/app.r$r.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    echo "orch: rank $r: nsys was still writing its report ${ORCH_STOP_GRACE_S} s after the stop;" \
         "killed (raise profile.stop_grace_s)" >&2
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  if [ -n "$app" ]; then kill -KILL "$app" 2>/dev/null || true; fi
  bash "$here/keep_report.sh" "$r" "$app" "${TMPDIR:-/tmp}/orch-kept-${ORCH_JOB_ID:-local}-r$r.qdstrm" || true
  rm -f "$f" "$ORCH_CTL_DIR/app.r$r.pid"
done
rm -f "$ORCH_CTL_DIR"/app.r*.pid "$ORCH_CTL_DIR"/released.r*  # the unprofiled ranks' (ended with torchrun)
rmdir "$ORCH_CTL_DIR" 2>/dev/null || true
exit "$rc"
