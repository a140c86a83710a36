#!/usr/bin/env bash
#SBATCH --job-name=ddp-cpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:30:00
#SBATCH --output=/orch/run/logs/%x_%j.out
# Early warning 90 s before the time limit (as submitit sets it): launch.sh stops every
# capture on it, and each nsys has 60 s to write its report before the limit's SIGTERM.
#SBATCH --signal=USR2@90
# orch sbatch script for job ddp-cpu (rendered by orch 0.1.0).
# Submit by hand with `sbatch /orch/run/scripts/sbatch.sh`, or let `orch submit` do it.
# Profiled ranks: 0-1; reports: /orch/run/reports/ddp-cpu_%q{ORCH_JOB_ID}_r%q{RANK}_%h.%p.nsys-rep
set -euo pipefail

# --- setup lines from the cluster config and job spec (trusted shell, verbatim) ---
# shellcheck disable=SC1090,SC1091

echo "orch: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, head node $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" >&2
# One task per node; launch.sh starts torchrun there. A failing node ends the job.
srun --kill-on-bad-exit=1 --nodes=1 --ntasks-per-node=1 bash /orch/run/scripts/launch.sh
