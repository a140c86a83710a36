#!/usr/bin/env bash
#SBATCH --job-name=pp-h100
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --partition=h100
#SBATCH --account=my-project
#SBATCH --time=00:20:00
#SBATCH --constraint=h100
#SBATCH --cpus-per-task=96
#SBATCH --gpus-per-node=8
#SBATCH --exclusive
#SBATCH --mail-type=END
#SBATCH --output=/orch/run/logs/%x_%j.out
# Early warning 90 s before the time limit (as submitit sets it): launch.sh stops every
# capture on it, and each nsys has 60 s to write its report before the limit's SIGTERM.
#SBATCH --signal=USR2@90
# orch sbatch script for job pp-h100 (rendered by orch 0.1.0).
# Submit by hand with `sbatch /orch/run/scripts/sbatch.sh`, or let `orch submit` do it.
# Profiled ranks: 0,8,16,24; reports: /orch/run/reports/pp-h100_%q{ORCH_JOB_ID}_r%q{RANK}_%h.%p.nsys-rep
set -euo pipefail

# --- setup lines from the cluster config and job spec (trusted shell, verbatim) ---
# shellcheck disable=SC1090,SC1091
source /etc/profile.d/modules.sh
module load cuda/12.8

echo "orch: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, head node $(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" >&2
# One task per node; launch.sh starts torchrun there. A failing node ends the job.
srun --kill-on-bad-exit=1 --nodes=4 --ntasks-per-node=1 bash /orch/run/scripts/launch.sh
