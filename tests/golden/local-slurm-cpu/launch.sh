#!/usr/bin/env bash
# orch per-node launch for job ddp-slurm-cpu (rendered by orch 0.1.0; do not edit).
# Runs once per node: by sbatch.sh (srun, one task per node), by `orch submit` through
# submitit, or by hand on one machine. It starts torchrun over the rank wrapper.
set -euo pipefail
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

exec python3 -m torch.distributed.run --nnodes="$nnodes" --nproc-per-node=2 \
  --max-restarts=0 "${rdzv[@]}" --no-python "$here/rank_wrapper.sh" python3 -u <REPO>/scripts/examples/train.py --steps 5
