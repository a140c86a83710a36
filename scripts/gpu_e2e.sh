#!/usr/bin/env bash
# End to end on real GPUs, orch driving: submit (local executor, NCCL) three runs of the
# example workload under nsys, collect and report each, and keep redacted exports.
#   1. ddp  : data parallel over 2 GPUs, rank 1 planted slow, GPU metrics, --pytorch=autograd-nvtx,
#             cudaProfilerApi capture range over steps 3..8
#   2. pp   : 2-stage pipeline, stage 1 twice as heavy
#   3. ok   : data parallel, no fault
# Usage: scripts/gpu_e2e.sh OUTDIR   (needs 2 GPUs, torch, orch installed, and nsys >= 2023
# at $NSYS or on PATH)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$(realpath -m "${1:?usage: $0 OUTDIR}")
mkdir -p "$out"
nsys_bin=${NSYS:-$(command -v nsys)}
nsys_version=$("$nsys_bin" --version | grep -oE '[0-9]{4}\.[0-9]+(\.[0-9]+)?' | head -n 1)
gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))')
work=$(mktemp -d /tmp/orch-gpu-e2e.XXXXXX)
export ORCH_CLUSTER_DIR=$work/clusters ORCH_RUNS=$work/runs
mkdir -p "$ORCH_CLUSTER_DIR"
cat >"$ORCH_CLUSTER_DIR/gpu-here.yaml" <<EOF
name: gpu-here
executor: local
gpu: {model: "$gpu", per_node: 2}
nsys: {path: "$nsys_bin", version: "$nsys_version"}
python: python3
env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1"}
EOF

spec() {  # spec NAME LAYOUT PROFILE_EXTRA ARGS...
  local name=$1 layout=$2 extra=$3
  shift 3
  local args
  args=$(printf '"%s", ' "$@")
  cat >"$work/$name.yaml" <<EOF
name: $name
cluster: gpu-here
launch:
  script: $PWD/scripts/examples/train.py
  args: [${args%, }]
  nproc_per_node: 2
layout: $layout
profile:
  ranks: all
  trace: [cuda, nvtx, osrt]
$extra
EOF
}
common=(--width 4096 --batch 2048 --microbatches 4)
spec ddp "{tp: 1, pp: 1, dp: 2}" "  capture_range: cudaProfilerApi
  capture_range_end: stop
  pytorch: autograd-nvtx
  gpu_metrics: {enabled: true, set: auto, frequency: 200}" \
  --steps 10 "${common[@]}" --slow-rank 1 --slow-ms 25 --capture 3:9
spec pp "{tp: 1, pp: 2, dp: 1}" "" --pp 2 --heavy-stage 1 --steps 8 "${common[@]}"
spec ok "{tp: 1, pp: 1, dp: 2}" "" --steps 8 "${common[@]}"

summary=$out/summary.txt
: >"$summary"
for name in ddp pp ok; do
  t0=$SECONDS
  orch submit "$work/$name.yaml" --wait --timeout 400 | tee "$work/$name.submit.log" || {
    echo "$name: submit/run failed" | tee -a "$summary"
    tail -n 60 "$ORCH_RUNS"/"$name"-*/submitit/*_0_log.err 2>/dev/null || true
    continue
  }
  t1=$SECONDS
  job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' "$work/$name.submit.log" | head -n 1)
  orch collect "$job"
  t2=$SECONDS
  run=$(dirname "$(grep -l "\"job_id\": \"$job\"" "$ORCH_RUNS"/*/manifest.json | head -n 1)")
  orch report "$job" --json "$work/$name.json" --html "$work/$name.html"
  t3=$SECONDS
  orch redact "$run"/exports/*.sqlite -o "$work/redacted"
  for f in "$work"/redacted/*.sqlite.gz; do  # drop the job id: <name>_r<rank>_<host>.<pid>
    mv "$f" "$out/${name}_$(basename "$f" | sed 's/^[^_]*_[^_]*_//')"
  done
  echo "$name: job $job submit+run $((t1 - t0))s collect $((t2 - t1))s report $((t3 - t2))s" | tee -a "$summary"
done
{ echo "gpu: $gpu"; echo "nsys: $nsys_version"; nvidia-smi -L || true; } >>"$summary"
(cd "$work" && tar -czf "$out/reports.tar.gz" ./*.json ./*.html ./*.submit.log)
ls -la "$out"
