#!/usr/bin/env bash
# Real captures of real-style training code through orch (tests/fixtures/real/).
#
#   capture.sh --cpu               smoke-run every workload here on CPU (gloo, tiny sizes, no nsys)
#   capture.sh --render DIR        write the cluster configs and job specs to DIR, `orch validate`
#                                  and `orch render` each (no GPU needed)
#   capture.sh --rehearse OUT [NAME...]
#                                  the --device flow here on CPU (local nsys, gloo, tiny sizes), to
#                                  test this script; nothing it makes is a fixture
#   capture.sh --fixtures SRC DEST
#                                  unpack the device's SRC/fx*.tar into DEST as committed fixtures:
#                                  each export (already `orch redact`ed) loses its OS-runtime
#                                  `accept` rows (c10d TCPStore polling, >1M rows on one rank),
#                                  VACUUM, gzip -9; prints what was removed per file
#   capture.sh --device OUT [NAME...]
#                                  on the 4-GPU machine: install what travelled (.whl/, .cap/),
#                                  then for each capture `orch submit --wait`, `orch collect`,
#                                  `orch report --json --html`, `orch redact`; pack into OUT
#                                  (at most 8 files of <= 15.5 MiB: fx*.tar, reports.tar.gz, ...)
#                                  With CAPTURE_MAP_IN_JOB=1 the jobs also map their ranks
#                                  (profile.map_in_job); after the report, collect runs again
#                                  in-process on the same exports (the job's parts set aside) and
#                                  writes reports/NAME.inproc.json beside NAME.json, and the job's
#                                  map metas go to reports/NAME.maps/
#
# On 4 GPUs, 2-GPU captures run two at a time, one on GPUs 0-1 and one on GPUs 2-3 (the second
# cluster config exports CUDA_VISIBLE_DEVICES=2,3 over what submitit's LocalExecutor set); the
# 4-GPU captures run alone. On 2 GPUs the captures run one by one and the 4-GPU ones are skipped. NVLink multicast stays off in every process (cluster env).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
mode=${1:?usage: $0 --cpu | --render DIR | --device OUT [NAME...]}
shift

# name | cluster | nproc | layout | ranks | gpu_metrics | script | args on the GPUs | tiny args (CPU)
CAPTURES=(
  "resnet_nw2|gpus01|2|{tp: 1, pp: 1, dp: 2}|all|no|resnet_ddp.py|2 128 --num-workers 2 --samples 768|2 8 --num-workers 2 --samples 32 --crop 64"
  "resnet_nw0|gpus23|2|{tp: 1, pp: 1, dp: 2}|all|no|resnet_ddp.py|2 128 --num-workers 0 --samples 768|1 8 --num-workers 0 --samples 16 --crop 64"
  "item_sync|gpus01|2|{tp: 1, pp: 1, dp: 2}|all|no|gpt2_ddp.py|--layers 4 --embd 512 --heads 8 --seq 256 --batch 16 --steps 14 --log-every 1|--layers 2 --embd 64 --heads 2 --seq 32 --batch 4 --steps 4"
  "healthy|gpus23|2|{tp: 1, pp: 1, dp: 2}|all|no|gpt2_ddp.py|--layers 12 --embd 1024 --heads 16 --seq 1024 --batch 16 --steps 12 --log-every 10 --bf16|--layers 2 --embd 64 --heads 2 --seq 32 --batch 4 --steps 4 --log-every 3 --bf16"
  "gpipe_m4|gpus01|2|{tp: 1, pp: 2, dp: 1}|all|no|pipeline_lm.py|--schedule gpipe --microbatches 4 --batch 32 --seq 512 --dim 2048 --heads 16 --layers 4 --steps 12|--schedule gpipe --microbatches 4 --batch 8 --seq 16 --dim 64 --heads 2 --layers 4 --vocab 100 --steps 3"
  "1f1b_m8|gpus23|2|{tp: 1, pp: 2, dp: 1}|all|no|pipeline_lm.py|--schedule 1f1b --microbatches 8 --batch 32 --seq 512 --dim 2048 --heads 16 --layers 4 --steps 12|--schedule 1f1b --microbatches 8 --batch 8 --seq 16 --dim 64 --heads 2 --layers 4 --vocab 100 --steps 3"
  "ddp_slowrank|gpus01|2|{tp: 1, pp: 1, dp: 2}|all|no|vit_ddp_eval.py|--batch 64 --steps 14 --eval-every 4 --eval-batches 6|--batch 2 --image-size 32 --classes 10 --steps 5 --eval-every 2 --eval-batches 2"
  "dp2pp2_all|gpus4|4|{tp: 1, pp: 2, dp: 2}|all|no|vit_pp_dp.py|--pp 2 --dp 2 --batch 64 --microbatches 4 --steps 12|--pp 2 --dp 2 --batch 4 --microbatches 2 --image-size 32 --classes 10 --steps 3"
  "dp2pp2_stage|gpus4|4|{tp: 1, pp: 2, dp: 2}|one-per-stage|no|vit_pp_dp.py|--pp 2 --dp 2 --batch 64 --microbatches 4 --steps 12|--pp 2 --dp 2 --batch 4 --microbatches 2 --image-size 32 --classes 10 --steps 3"
  "tp2dp2|gpus4|4|{tp: 2, pp: 1, dp: 2}|all|yes|tp_fsdp.py|--tp 2 --dp 2 --dim 4096 --layers 6 --heads 32 --hidden 11008 --seq 2048 --batch 4 --steps 12|--tp 2 --dp 2 --dim 64 --layers 2 --heads 4 --hidden 128 --vocab 100 --seq 16 --batch 2 --steps 4"
)
# Run groups: the members of one group run at the same time (disjoint GPUs).
ARGS_FIELD=7 REHEARSE=0
GROUPS_=("resnet_nw2 resnet_nw0" "item_sync healthy" "gpipe_m4 1f1b_m8" "ddp_slowrank" "dp2pp2_all" "dp2pp2_stage" "tp2dp2")

field() {  # field NAME INDEX
  local row
  for row in "${CAPTURES[@]}"; do
    if [ "${row%%|*}" = "$1" ]; then
      IFS='|' read -r -a f <<<"$row"
      printf '%s' "${f[$2]}"
      return 0
    fi
  done
  echo "no capture named $1" >&2
  return 1
}

write_configs() {  # write_configs DIR NSYS NSYS_VERSION GPU_MODEL [GPUS_PER_NODE_SCALE]
  local dir=$1 nsys=$2 ver=$3 gpu=$4 scale=${5:-1} env gpus23_env=', CUDA_VISIBLE_DEVICES: "2,3"'
  # Fewer than 4 GPUs here: the second 2-GPU slot is the first one again (groups then run one by one).
  [ "${NGPU:-4}" -lt 4 ] && gpus23_env=""
  env='NCCL_NVLS_ENABLE: "0", TORCH_SYMM_MEM_DISABLE_MULTICAST: "1", NVSHMEM_DISABLE_NVLS: "1"'
  mkdir -p "$dir/clusters"
  cat >"$dir/clusters/gpus01.yaml" <<EOF
name: gpus01
executor: local
gpu: {model: "$gpu", per_node: $((2 * scale))}
nsys: {path: "$nsys", version: "$ver"}
python: python3
env: {$env}
EOF
  cat >"$dir/clusters/gpus23.yaml" <<EOF
name: gpus23
executor: local
gpu: {model: "$gpu", per_node: $((2 * scale))}
nsys: {path: "$nsys", version: "$ver"}
python: python3
env: {$env${gpus23_env}}
EOF
  cat >"$dir/clusters/gpus4.yaml" <<EOF
name: gpus4
executor: local
gpu: {model: "$gpu", per_node: $((4 * scale))}
nsys: {path: "$nsys", version: "$ver"}
python: python3
env: {$env}
EOF
}

write_spec() {  # write_spec DIR NAME
  local dir=$1 name=$2 args a metrics=""
  args=""
  for a in $(field "$name" "$ARGS_FIELD"); do args+="\"$a\", "; done
  if [ "$(field "$name" 5)" = yes ] && [ "$REHEARSE" = 0 ]; then
    metrics="  gpu_metrics: {enabled: true, set: auto, frequency: 200}"
  fi
  cat >"$dir/$name.yaml" <<EOF
name: $name
cluster: $(field "$name" 1)
slurm: {time: "00:03:00"}
launch:
  script: $here/$(field "$name" 6)
  args: [${args%, }]
  nproc_per_node: $(field "$name" 2)
layout: $(field "$name" 3)
profile:
  ranks: $(field "$name" 4)
  trace: [cuda, nvtx, osrt]
  sample: none
  cpuctxsw: none
$metrics
EOF
  if [ "${CAPTURE_MAP_IN_JOB:-0}" = 1 ]; then echo "  map_in_job: true" >>"$dir/$name.yaml"; fi
}

cpu_shim() {  # CPU runs only: torch.cuda.nvtx needs a CUDA build of torch; make it a no-op
  local shim
  shim=$(mktemp -d /tmp/orch-cpu-shim.XXXXXX)
  cat >"$shim/sitecustomize.py" <<'EOF'
import contextlib
import torch
if not torch.cuda.is_available():
    import torch.cuda.nvtx as _nvtx
    _nvtx.range_push = lambda *a, **k: 0
    _nvtx.range_pop = lambda *a, **k: 0
    _nvtx.range = lambda *a, **k: contextlib.nullcontext()
EOF
  export PYTHONPATH="$shim${PYTHONPATH:+:$PYTHONPATH}"
}

cpu_smoke() {
  cpu_shim
  cd "$here"
  local row name
  for row in "${CAPTURES[@]}"; do
    name=${row%%|*}
    echo "== cpu smoke: $name"
    # shellcheck disable=SC2046
    torchrun --standalone --nproc_per_node "$(field "$name" 2)" "$(field "$name" 6)" $(field "$name" 8) --device cpu
  done
  echo "cpu smoke: all workloads ran"
}

render_all() {  # render_all DIR
  local dir=$1 row name
  write_configs "$dir" nsys 2025.3.1 "NVIDIA H200"
  export ORCH_CLUSTER_DIR=$dir/clusters
  for row in "${CAPTURES[@]}"; do
    name=${row%%|*}
    write_spec "$dir" "$name"
    orch validate "$dir/$name.yaml"
    orch render "$dir/$name.yaml" -o "$dir/render-$name" >/dev/null
    bash -n "$dir/render-$name/scripts/rank_wrapper.sh"
  done
  echo "rendered ${#CAPTURES[@]} job specs under $dir"
}

device_setup() {  # installs what travelled; sets NSYS
  cd "$repo"
  # typing_extensions travels only for an image older than what pydantic needs.
  if python3 -c 'import importlib.metadata as m, sys; v = tuple(int(x) for x in m.version("typing_extensions").split(".")[:2]); sys.exit(v < (4, 15))'; then
    rm -f .whl/typing_extensions-*.whl
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  rm -rf /tmp/orchsrc && mkdir -p /tmp/orchsrc && tar -xf .cap/orch.tar -C /tmp/orchsrc
  python3 -m pip install -q --no-deps --no-build-isolation --no-cache-dir --target /tmp/site /tmp/orchsrc
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
  local h=/opt/nvidia/nsight-compute/2025.3.1/host
  ln -sfn "$h/linux-desktop-glibc_2_11_3-x64" "$h/host-linux-x64"
  cp .cap/libs/libdw.so.1 .cap/libs/libelf.so.1 "$h/linux-desktop-glibc_2_11_3-x64/"
  NSYS=$h/target-linux-x64/nsys
  "$NSYS" --version
}

capture_one() {  # capture_one WORK NAME  (runs in the background; writes WORK/status/NAME)
  local work=$1 name=$2 job run t0=$SECONDS log
  log=$work/logs/$name.log
  {
    echo "== $name: $(date -u +%T) $(field "$name" 6) $(field "$name" 7)"
    if ! timeout "${CAPTURE_JOB_TIMEOUT_S:-120}" orch submit "$work/$name.yaml" --wait \
        --timeout "$((${CAPTURE_JOB_TIMEOUT_S:-120} - 10))" >"$work/logs/$name.submit.log" 2>&1; then
      cat "$work/logs/$name.submit.log"
      job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' "$work/logs/$name.submit.log" | head -n 1)
      [ -n "$job" ] && { orch cancel "$job" || true; }
      tail -n 80 "$ORCH_RUNS"/"$name"-*/submitit/*_0_log.err 2>/dev/null || true
      tail -n 40 "$ORCH_RUNS"/"$name"-*/logs/* 2>/dev/null || true
      echo "$name: FAILED submit/run after $((SECONDS - t0))s" | tee "$work/status/$name"
      return 0
    fi
    cat "$work/logs/$name.submit.log"
    local t1=$SECONDS
    job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' "$work/logs/$name.submit.log" | head -n 1)
    run=$(dirname "$(grep -l "\"job_id\": \"$job\"" "$ORCH_RUNS"/*/manifest.json | head -n 1)")
    tail -n 30 "$run"/submitit/*_0_log.out 2>/dev/null || true
    orch collect "$job" || { echo "$name: FAILED collect" | tee "$work/status/$name"; return 0; }
    local t2=$SECONDS
    orch report "$job" --json "$work/reports/$name.json" --html "$work/reports/$name.html" \
      >"$work/reports/$name.txt" 2>&1 || echo "$name: report exit $?"
    cat "$work/reports/$name.txt"
    local t3=$SECONDS
    [ "${CAPTURE_MAP_IN_JOB:-0}" = 1 ] && inproc_again "$work" "$name" "$job" "$run"
    mkdir -p "$work/redacted/$name" "$work/fx/$name"
    orch redact "$run"/exports/*.sqlite -o "$work/redacted/$name"
    local f
    for f in "$work/redacted/$name"/*.sqlite.gz; do  # drop the job id: NAME_r<rank>_<host>.<pid>
      mv "$f" "$work/fx/$name/$(basename "$f" | sed "s/^${name}_${job}_/${name}_/")"
    done
    cp "$run/manifest.json" "$work/reports/$name.manifest.json"
    ls -la "$work/fx/$name"
    echo "$name: OK job $job submit+run $((t1 - t0))s collect $((t2 - t1))s report $((t3 - t2))s" | tee "$work/status/$name"
  } >"$log" 2>&1
}

inproc_again() {  # inproc_again WORK NAME JOB RUN: the same exports collected in-process
  local work=$1 name=$2 job=$3 run=$4 t0=$SECONDS t1
  grep -h "orch: mapped\|could not map\|is not on" "$run"/submitit/*_log.err || true
  mkdir -p "$work/reports/$name.maps"
  cp "$run"/parts/reports/*.json "$work/reports/$name.maps/" 2>/dev/null || true
  mv "$run/parts" "$run/parts.job" && mv "$run/profile.duckdb" "$run/profile.job.duckdb"
  orch collect "$job" || { echo "$name: FAILED in-process collect"; return 0; }
  t1=$SECONDS
  orch report "$job" --json "$work/reports/$name.inproc.json" >/dev/null 2>&1 || echo "$name: in-process report exit $?"
  mv "$run/parts.job" "$run/parts"  # profile.job.duckdb may read its events from them
  echo "$name: in-process again: collect $((t1 - t0))s report $((SECONDS - t1))s"
}

pack() {  # pack WORK OUT: all finished fixtures into <= 6 tars of <= 15.5 MiB, reports into one tgz
  local work=$1 out=$2
  python3 - "$work" "$out" <<'EOF'
import os, sys, tarfile
work, out = sys.argv[1:]
files = []
for name in sorted(os.listdir(f"{work}/fx")):
    for f in sorted(os.listdir(f"{work}/fx/{name}")):
        p = f"{work}/fx/{name}/{f}"
        files.append((os.path.getsize(p), f"{name}/{f}", p))
cap, bins = int(15.5 * 2**20), []
for size, arc, p in sorted(files, reverse=True):
    for b in bins:
        if b[0] + size + 4096 <= cap:
            b[0] += size + 4096; b[1].append((arc, p)); break
    else:
        bins.append([size + 4096, [(arc, p)]])
total = sum(b[0] for b in bins)
if len(bins) > 6 or total > 58 * 2**20:
    print(f"pack: {len(bins)} bins, {total / 2**20:.1f} MiB: over what $OUT returns; keeping the first 6 / 58 MiB")
kept, acc = [], 0
for b in bins:
    if len(kept) < 6 and acc + b[0] <= 58 * 2**20:
        kept.append(b); acc += b[0]
for i, b in enumerate(kept):
    tmp = f"{out}/.fx{i}.tar.tmp"
    with tarfile.open(tmp, "w") as t:
        for arc, p in sorted(b[1]):
            t.add(p, arcname=arc)
    os.replace(tmp, f"{out}/fx{i}.tar")
for i in range(len(kept), 8):
    if os.path.exists(f"{out}/fx{i}.tar"):
        os.remove(f"{out}/fx{i}.tar")
print(f"pack: {len(files)} exports in {len(kept)} tars, {acc / 2**20:.1f} MiB")
EOF
  tar -czf "$out/.reports.tmp" -C "$work" reports logs status specs 2>/dev/null && mv "$out/.reports.tmp" "$out/reports.tar.gz"
}

device_run() {
  local out=$1 deadline=${CAPTURE_DEADLINE_S:-540} g name
  shift
  local wanted=("$@")
  out=$(realpath -m "$out")
  mkdir -p "$out"
  if [ "$REHEARSE" = 0 ]; then
    device_setup
  else
    NSYS=${NSYS:-/usr/lib/nsight-systems/target-linux-x64/nsys}
    cpu_shim
  fi
  local work=/tmp/orch-real
  rm -rf "$work" && mkdir -p "$work"/{logs,status,reports,redacted,fx,specs}
  export ORCH_CLUSTER_DIR=$work/specs/clusters ORCH_RUNS=$work/runs
  local gpu nsys_ver
  gpu=$(python3 -c 'import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")')
  nsys_ver=$("$NSYS" --version | grep -oE '[0-9]{4}\.[0-9]+(\.[0-9]+)?' | head -n 1)
  {
    echo "gpu: $gpu x $(python3 -c 'import torch; print(torch.cuda.device_count())')"
    [ "$REHEARSE" = 1 ] && echo "REHEARSAL on CPU (gloo, tiny sizes): not a capture to keep"
    echo "nsys: $nsys_ver ($NSYS)"
    python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-", "torchvision", torchvision.__version__, "transformers", transformers.__version__)'
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader || true
    nvidia-smi topo -m 2>/dev/null | head -n 6 || true
    lscpu | grep -E 'Model name|^CPU\(s\)' || true
    echo "orch: commit $(cat "$repo/.cap/ORCH_COMMIT" 2>/dev/null || echo '?') (installed from .cap/orch.tar)"
  } | tee "$work/status/_env"
  NGPU=${CAPTURE_NGPU:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
  [ "$REHEARSE" = 1 ] && NGPU=${CAPTURE_NGPU:-4}
  write_configs "$work/specs" "$NSYS" "$nsys_ver" "$gpu" $((1 - REHEARSE))
  local row
  for row in "${CAPTURES[@]}"; do
    write_spec "$work/specs" "${row%%|*}"
    cp "$work/specs/${row%%|*}.yaml" "$work/${row%%|*}.yaml"
  done
  for g in "${GROUPS_[@]}"; do
    local members=()
    for name in $g; do
      if [ "${#wanted[@]}" -eq 0 ] || [[ " ${wanted[*]} " == *" $name "* ]]; then members+=("$name"); fi
    done
    [ "${#members[@]}" -eq 0 ] && continue
    if [ $((SECONDS + 75)) -gt "$deadline" ]; then
      echo "SKIPPED (deadline, ${SECONDS}s used): ${members[*]}" | tee -a "$work/status/_skipped"
      continue
    fi
    echo "== group ${members[*]} at ${SECONDS}s"
    local pids=()
    for name in "${members[@]}"; do
      if [ "$(field "$name" 2)" -gt "$NGPU" ]; then
        echo "$name: SKIPPED (needs $(field "$name" 2) GPUs, this machine has $NGPU)" | tee "$work/status/$name"
        continue
      fi
      if [ "$NGPU" -ge 4 ]; then
        capture_one "$work" "$name" &
        pids+=($!)
      else
        if [ $((SECONDS + 60)) -gt "$deadline" ]; then
          echo "$name: SKIPPED (deadline, ${SECONDS}s used)" | tee "$work/status/$name"
          continue
        fi
        capture_one "$work" "$name"
      fi
    done
    [ "${#pids[@]}" -gt 0 ] && { wait "${pids[@]}" || true; }
    for name in "${members[@]}"; do
      cat "$work/logs/$name.log" 2>/dev/null || true
    done
    pack "$work" "$out"
  done
  cat "$work"/status/* 2>/dev/null || true
  pack "$work" "$out"
  ls -la "$out"
}

make_fixtures() {  # make_fixtures SRC DEST
  local src=$1 dest=$2 tmp
  tmp=$(mktemp -d /tmp/orch-fixtures.XXXXXX)
  mkdir -p "$dest"
  for t in "$src"/fx*.tar; do tar -xf "$t" -C "$tmp"; done
  python3 - "$tmp" "$dest" <<'EOF'
import gzip, os, shutil, sqlite3, sys
tmp, dest = sys.argv[1:]
print("file\tosrt_rows\taccept_rows_removed\tcallchain_rows_removed\tgz_bytes")
for cap in sorted(os.listdir(tmp)):
    for f in sorted(os.listdir(os.path.join(tmp, cap))):
        plain = os.path.join(tmp, f[:-3])
        with gzip.open(os.path.join(tmp, cap, f)) as a, open(plain, "wb") as b:
            shutil.copyfileobj(a, b)
        con = sqlite3.connect(plain)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        n_osrt = n_acc = n_cc = 0
        if "OSRT_API" in tables:
            n_osrt = con.execute("SELECT count(*) FROM OSRT_API").fetchone()[0]
            n_acc = con.execute("DELETE FROM OSRT_API WHERE nameId IN "
                                "(SELECT id FROM StringIds WHERE value = 'accept')").rowcount
            if "OSRT_CALLCHAINS" in tables:
                n_cc = con.execute("DELETE FROM OSRT_CALLCHAINS WHERE id NOT IN "
                                   "(SELECT callchainId FROM OSRT_API)").rowcount
        con.commit()
        con.execute("VACUUM")
        con.close()
        out = os.path.join(dest, f)
        with open(plain, "rb") as a, gzip.GzipFile(out, "wb", compresslevel=9, mtime=0) as b:
            shutil.copyfileobj(a, b)
        os.unlink(plain)
        print(f"{f}\t{n_osrt}\t{n_acc}\t{n_cc}\t{os.path.getsize(out)}")
EOF
  rm -rf "$tmp"
}

case $mode in
  --cpu) cpu_smoke ;;
  --render) render_all "$(realpath -m "${1:?--render DIR}")" ;;
  --device) device_run "$@" ;;
  --fixtures) make_fixtures "$(realpath -m "${1:?--fixtures SRC DEST}")" "$(realpath -m "${2:?--fixtures SRC DEST}")" ;;
  --rehearse) REHEARSE=1 ARGS_FIELD=8 CAPTURE_DEADLINE_S=${CAPTURE_DEADLINE_S:-3000} \
    CAPTURE_JOB_TIMEOUT_S=${CAPTURE_JOB_TIMEOUT_S:-600} device_run "$@" ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
