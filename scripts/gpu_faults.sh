#!/usr/bin/env bash
# Failing multi-GPU jobs on real GPUs, orch driving (local executor, NCCL, every GPU of the machine): each
# scenario is one `orch submit` of scripts/workloads/ddp_faults.py (the tutorial's ResNet-50
# DDP trainer with one real fault or slowdown; the pipeline and tensor-parallel layouts run
# vit_pp_dp.py and tp_fsdp.py), its reports exported with the same nsys, and its run
# directory (scripts, logs, dumps, manifest, exports; no .nsys-rep) packed as OUTDIR/NAME.tar.xz
# for `orch collect` elsewhere; OUTDIR/summary.txt has each rank's surviving rows counted with
# plain sqlite3. ORCH_STOP_RELEASE (default abort,flush) goes to every rank's hook.
# Usage: scripts/gpu_faults.sh OUTDIR SCENARIO...   (SCENARIO: a name below; `+` between two
#        names runs them at the same time; the faults are on ranks 0 and 1; NAME@SELECTOR profiles
#        the ranks of that profile.ranks selector instead of all, NAME@metrics (or
#        NAME@SELECTOR@metrics) also samples GPU metrics, one collector per node; the run is
#        named with `-` for `@`; MAP_IN_JOB=true maps each rank's export in the job). Needs 2 or
#        more GPUs, torch, orch and nsys >= 2023 at $NSYS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=$(realpath -m "${1:?usage: $0 OUTDIR SCENARIO...}")
shift
mkdir -p "$out"
nsys_bin=${NSYS:-$(command -v nsys)}
nsys_version=$("$nsys_bin" --version | grep -oE '[0-9]{4}\.[0-9]+(\.[0-9]+)?' | head -n 1)
gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))')
work=$(mktemp -d /tmp/orch-gpu-faults.XXXXXX)
export ORCH_CLUSTER_DIR=$work/clusters ORCH_RUNS=$work/runs
mkdir -p "$ORCH_CLUSTER_DIR"
cat >"$ORCH_CLUSTER_DIR/gpu-here.yaml" <<EOF
name: gpu-here
executor: local
gpu: {model: "$gpu", per_node: $gpus}
nsys: {path: "$nsys_bin", version: "$nsys_version"}
python: python3
env: {NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1",
      ORCH_STOP_RELEASE: "${ORCH_STOP_RELEASE:-abort,flush}"}
EOF

# scenario NAME -> "TIME|ENV|WORKLOAD|LAYOUT|ARGS": the Slurm time limit (minutes), extra
# environment, the workload (scripts/workloads/, ddp_faults.py where empty), the layout (data
# parallel over every GPU where empty), the workload's arguments (ddp_faults.py: after
# `--steps 24`). The faults are on ranks 0 and 1; nothing here names them in a file name.
scenario() {
  case $1 in
    timeout) echo "2||||--fault stuck-loader --fault-rank 1 --fault-step 8" ;;
    timeout-unreleased) echo "2|ORCH_STOP_RELEASE: none, TORCH_NCCL_ASYNC_ERROR_HANDLING: '3'|||--fault stuck-loader --fault-rank 1 --fault-step 8" ;;
    watchdog) echo "3||||--fault stuck-loader --fault-rank 0 --fault-step 8 --nccl-timeout 25" ;;
    extra-collective) echo "5||||--fault extra-collective --fault-rank 1 --fault-step 8 --nccl-timeout 25" ;;
    cancel) echo "10||||--steps 2000 --log-every 10" ;;
    oom) echo "5||||--fault oom --fault-rank 0 --fault-step 8" ;;
    leak) echo "5||||--fault leak --fault-rank 0 --fault-step 0 --steps 100" ;;
    raise) echo "5||||--fault raise --fault-rank 1 --fault-step 8" ;;
    sigkill) echo "5||||--fault sigkill --fault-rank 1 --fault-step 8" ;;
    healthy) echo "5||||--steps 20 --batch 96 --num-workers 8" ;;
    gpu-straggler) echo "5||||--steps 20 --batch 96 --num-workers 8 --fault gpu-straggler --fault-rank 1 --fault-step 0" ;;
    cpu-straggler) echo "5||||--steps 20 --batch 96 --num-workers 8 --fault cpu-straggler --fault-rank 0 --fault-step 0" ;;
    slow-input) echo "5||||--steps 30 --num-workers 0" ;;
    slow-loader) echo "5||||--steps 20 --batch 96 --num-workers 8 --fault slow-loader --fault-rank 1 --fault-step 0" ;;
    input-bound) echo "5||||--steps 20 --batch 96 --num-workers 2" ;;  # healthy's job, every loader with 2 workers
    accum|accum-[0-9]) echo "5||||--steps 48 --accum 4 --batch 32 --num-workers 8" ;;  # accum-N: a rerun
    accum-bind|accum-bind-[0-9]) echo "5||||--steps 48 --accum 4 --batch 32 --num-workers 8 --bind-cpus" ;;
    stage-[0-9]*-[0-9]*)  # a 1F1B pipeline of ViT-B/16, its 12 blocks split A+B (stage-A-B), the
      # first stage's DataLoader with 8 workers, or N (stage-A-B-wN)
      local split=${1#stage-} workers=8
      [[ $split == *-w* ]] && { workers=${split##*-w}; split=${split%-w*}; }
      echo "10||vit_pp_dp.py|{pp: 2, dp: $((gpus / 2)), microbatches: 4}|--pp 2 --dp $((gpus / 2)) --microbatches 4 --schedule 1f1b --steps 16 --workers $workers --stage-blocks ${split/-/,}" ;;
    pp-slow-loader)  # stage-6-6's job, first-stage rank 1's DataLoader with 1 worker
      echo "10||vit_pp_dp.py|{pp: 2, dp: $((gpus / 2)), microbatches: 4}|--pp 2 --dp $((gpus / 2)) --microbatches 4 --schedule 1f1b --steps 16 --workers 8 --stage-blocks 6,6 --slow-loader-rank 1 --slow-loader-workers 1" ;;
    pp) echo "10||vit_pp_dp.py|{pp: 2, dp: $((gpus / 2)), microbatches: 4}|--pp 2 --dp $((gpus / 2)) --microbatches 4 --schedule gpipe --steps 12" ;;
    tp) echo "10||tp_fsdp.py|{tp: 2, dp: $((gpus / 2))}|--tp 2 --dp $((gpus / 2)) --steps 8" ;;
    tp-quiet) echo "10||tp_fsdp.py|{tp: 2, dp: $((gpus / 2))}|--tp 2 --dp $((gpus / 2)) --steps 8 --log-every 0" ;;
    # rank 1 (rank 0 on one GPU) hands its losses to a thread it never stops: its process never
    # ends once its loop is done; orch ends it profile.exit_grace_s (default) after
    uploader) echo "5||stuck_rank.py||--steps 200 --uploader-rank $((gpus > 1 ? 1 : 0))" ;;
    *) echo "unknown scenario $1" >&2; return 2 ;;
  esac
}

run_one() {  # run_one NAME[@OPT...]: submit, wait (cancel: cancel once rank 0 logs step 10), export, pack
  local name=${1//@/-} def time envs workload layout args job run t0=$SECONDS ranks=all metrics=false opt
  local -a opts
  IFS='@' read -r -a opts <<<"$1"
  for opt in "${opts[@]:1}"; do
    case $opt in metrics) metrics=true ;; *) ranks=$opt ;; esac
  done
  def=$(scenario "${opts[0]}")
  IFS='|' read -r time envs workload layout args <<<"$def"
  # shellcheck disable=SC2086 # the arguments are words
  set -- $args
  [ -n "$workload" ] || { workload=ddp_faults.py; set -- --steps 24 "$@"; }
  [ -n "$layout" ] || layout="{dp: $gpus}"
  local list
  list=$(printf '"%s", ' "$@")
  cat >"$work/$name.yaml" <<EOF
name: $name
cluster: gpu-here
slurm: {time: "$time", gpus_per_node: $gpus}
launch:
  script: $PWD/scripts/workloads/$workload
  args: [${list%, }]
  nproc_per_node: $gpus
  env: {${envs}}
layout: $layout
profile:
  ranks: $ranks
  gpu_metrics: {enabled: $metrics, frequency: 1000}
  trace: [cuda, nvtx, osrt]
  cuda_memory_usage: true
  map_in_job: ${MAP_IN_JOB:-false}
  stop_grace_s: 40
  warn_lead_s: 50
EOF
  if [ "$name" = cancel ]; then
    orch submit "$work/$name.yaml" >"$work/$name.submit.log" 2>&1
    job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' "$work/$name.submit.log" | head -n 1)
    run=$(dirname "$(grep -l "\"job_id\": \"$job\"" "$ORCH_RUNS"/*/manifest.json | head -n 1)")
    local until=$((SECONDS + 300))
    while [ "$SECONDS" -lt "$until" ] && ! grep -qs '^step 10$' "$run"/submitit/*_log.out; do sleep 0.5; done
    orch cancel "$job" >>"$work/$name.submit.log" 2>&1 || true
    until=$((SECONDS + 300))
    # (the state read whole first: under pipefail, grep -q closing the pipe early fails the test)
    while [ "$SECONDS" -lt "$until" ] && ! grep -qE 'CANCELLED|COMPLETED|FAILED|TIMEOUT' \
      <<<"$(orch status "$job" 2>/dev/null || true)"
    do sleep 2; done
  else
    orch submit "$work/$name.yaml" --wait --timeout 900 >"$work/$name.submit.log" 2>&1 || true
    job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' "$work/$name.submit.log" | head -n 1)
  fi
  run=$(dirname "$(grep -l "\"job_id\": \"$job\"" "$ORCH_RUNS"/*/manifest.json | head -n 1)")
  orch status "$job" >"$run/status.txt" 2>&1 || true
  cp "$work/$name.yaml" "$work/$name.submit.log" "$run/"
  mkdir -p "$run/exports"
  local rep base
  for rep in "$run"/reports/*.nsys-rep; do
    [ -e "$rep" ] || continue
    base=$(basename "$rep" .nsys-rep)
    if [ ! -s "$run/exports/$base.sqlite" ]; then
      "$nsys_bin" export --type sqlite --force-overwrite true -o "$run/exports/$base.sqlite" "$rep" >/dev/null 2>&1 ||
        echo "$name: export of $base failed" >>"$out/summary.txt"
    fi
  done
  # What survived, per rank, from the exports themselves (plain sqlite3).
  python3 - "$run" >>"$out/summary.txt" <<'PY'
import glob, os, sqlite3, sys
run = sys.argv[1]
for f in sorted(glob.glob(os.path.join(run, "exports", "*.sqlite"))):
    con = sqlite3.connect(f)
    have = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    n = {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] if t in have else None
         for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUDA_GPU_MEMORY_USAGE_EVENTS")}
    print(f"  {os.path.basename(f)}: kernels {n['CUPTI_ACTIVITY_KIND_KERNEL']} cuda_api {n['CUPTI_ACTIVITY_KIND_RUNTIME']}"
          f" nvtx {n['NVTX_EVENTS']} mem_events {n['CUDA_GPU_MEMORY_USAGE_EVENTS']}")
PY
  echo "$name: job $job $((SECONDS - t0)) s: $(head -n 3 "$run/status.txt" | tr '\n' ' ')" >>"$out/summary.txt"
  tar -C "$(dirname "$run")" --exclude='*.nsys-rep' --exclude='*.qdstrm' --exclude='parts' \
    -I 'xz -T0 -6' -cf "$out/$name.tar.xz" "$(basename "$run")"
}

for item in "$@"; do
  pids=()
  IFS='+' read -r -a names <<<"$item"
  for name in "${names[@]}"; do run_one "$name" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid" || echo "run_one failed: $pid" >>"$out/summary.txt"; done
done
{ echo "gpu: $gpu x $gpus"; echo "nsys: $nsys_version"; } >>"$out/summary.txt"
