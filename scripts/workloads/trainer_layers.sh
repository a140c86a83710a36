#!/usr/bin/env bash
# The HF Trainer's step (hf_trainer.py --fp16, 1 micro-batch) through each layer of an orch
# capture in turn, on one GPU of the device machine, in one call: plain python3, torchrun (the
# Trainer then makes its process group), orch's rank hooks (loop marks; then the Python sampler
# too), and under nsys alone and with all of them. Each prints the median step of each run.
# What it found is in tests/fixtures/loops/README.md (the fourteenth call).
#
# Run from the repository root; it needs in .cap/ (untracked, it travels with the working tree):
#   .cap/libs/      libdw.so.1 and libelf.so.1 for the nsys inside Nsight Compute
#                   (capture_modern.sh --bundle makes them)
#   .cap/nvtx/      the nvtx==0.2.10 wheel for the machine's Python (pip download --python-version
#                   3.12 --only-binary :all: --no-deps nvtx==0.2.10 -d .cap/nvtx)
#   .cap/pyhooks/   the rank hooks orch renders for a job whose profile has python_sampling_ms: 10
#                   (orchestrator.render.render(...).write(), its scripts/pyhooks folder)
set -uo pipefail
h=/opt/nvidia/nsight-compute/2025.3.1/host
ln -sfn "$h/linux-desktop-glibc_2_11_3-x64" "$h/host-linux-x64"
cp .cap/libs/libdw.so.1 .cap/libs/libelf.so.1 "$h/linux-desktop-glibc_2_11_3-x64/"
nsys=$h/target-linux-x64/nsys
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-deps --no-index --target /tmp/nvx .cap/nvtx/*.whl 2>&1 | tail -1
hooks=$PWD/.cap/pyhooks:/tmp/nvx
mkdir -p /tmp/dumps/flight_recorder
cd scripts/workloads || exit 1
export NCCL_NVLS_ENABLE=0 ORCH_DUMP_DIR=/tmp/dumps PYTHONUNBUFFERED=1
args=(hf_trainer.py --accum 1 --steps 30 --workers 2 --fp16)
torchrun=(python3 -m torch.distributed.run --standalone --nproc-per-node 1)
trace=("--trace=cuda,nvtx,osrt" --sample=none --cpuctxsw=none --force-overwrite=true)

runs() {  # runs NAME N ENV... COMMAND...: the median step of each of N runs in one process
  local name=$1 n=$2
  shift 2
  echo "== $name"
  timeout 170 env "$@" "${args[@]}" --repeat "$n" 2>&1 | grep -E "median step|rror" | tail -3
}

runs "python3" 3 PYTHONPATH=/tmp/nvx python3
runs "torchrun" 3 PYTHONPATH=/tmp/nvx "${torchrun[@]}"
runs "torchrun + hooks, marks, no sampling" 3 PYTHONPATH="$hooks" ORCH_PY_SAMPLE_MS=0 "${torchrun[@]}"
runs "torchrun + hooks, marks, sampling 10 ms" 3 PYTHONPATH="$hooks" ORCH_PY_SAMPLE_MS=10 "${torchrun[@]}"
runs "python3 again" 3 PYTHONPATH=/tmp/nvx python3
runs "nsys, python3" 2 PYTHONPATH=/tmp/nvx "$nsys" profile "${trace[@]}" -o /tmp/npython python3
runs "nsys, torchrun + hooks with sampling" 2 PYTHONPATH="$hooks" ORCH_PY_SAMPLE_MS=10 \
  "$nsys" profile "${trace[@]}" -o /tmp/norch "${torchrun[@]}"
