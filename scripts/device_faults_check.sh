#!/usr/bin/env bash
# On a GPU machine with no package index (the device machines): failing NCCL jobs on every GPU
# with the maps made in the job, each run then collected twice, on the Parquet-parts route (the
# in-job maps reused) and in process, and the two reports compared; what each rank left in
# dumps/ is listed. BUNDLE is what scripts/device_bundle.sh made; OUT gets gpu_faults.sh's packed
# runs (OUT/f) and each run's two report JSONs.
# Usage: scripts/device_faults_check.sh BUNDLE OUT SCENARIO...   (scenarios: scripts/gpu_faults.sh)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
bundle=$(realpath "${1:?usage: $0 BUNDLE OUT SCENARIO...}")
out=$(realpath -m "${2:?usage: $0 BUNDLE OUT SCENARIO...}")
shift 2
mkdir -p "$out"
# NVLink multicast stays off: a program using it can take a shared host's GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
host=/opt/nvidia/nsight-compute/2025.3.1/host
ln -sfn "$host/linux-desktop-glibc_2_11_3-x64" "$host/host-linux-x64"
libs=$(mktemp -d)
for deb in "$bundle"/debs/*.deb; do dpkg -x "$deb" "$libs"; done
for lib in libdw.so.1 libelf.so.1; do
  cp -L "$(find "$libs" -name "$lib" | head -n 1)" "$host/linux-desktop-glibc_2_11_3-x64/$lib"
done
export NSYS=$host/target-linux-x64/nsys
"$NSYS" --version
python3 -m pip install -q --no-index --no-deps "$bundle"/wheels/*.whl 2>&1 | tail -n 3
python3 -c 'import duckdb, orchestrator, torch; print("orch", orchestrator.__version__, "torch", torch.__version__, "GPUs", torch.cuda.device_count())'
command -v orch >/dev/null || PATH=$(dirname "$(python3 -c 'import sys; print(sys.executable)')"):$PATH
before=$(ls -d /tmp/orch-gpu-faults.* 2>/dev/null || true)
MAP_IN_JOB=true bash scripts/gpu_faults.sh "$out/f" "$@"
cat "$out/f/summary.txt"
for work in /tmp/orch-gpu-faults.*; do
  grep -qxF "$work" <<<"$before" && continue
  for run in "$work"/runs/*/; do
    run=${run%/}
    name=$(basename "$run")
    echo "== $name"
    grep -h "orch: mapped" "$run"/submitit/*_log.err 2>/dev/null | sort -u
    for f in "$run"/dumps/stacks.r*.txt "$run"/dumps/flight_recorder/rank_*; do
      [ -e "$f" ] && echo "  ${f#"$run"/}: $(stat -c %s "$f") bytes"
    done
    cp -r "$run" "$run.inproc"
    rm -rf "$run.inproc/parts" "$run.inproc/profile.duckdb"
    orch collect "$run" --parts --map-stats --workers 8 2>&1 | tail -n 2
    orch report "$run" --json "$out/$name.parts.json" >"$out/$name.parts.txt" 2>&1
    orch collect "$run.inproc" >/dev/null 2>&1
    orch report "$run.inproc" --json "$out/$name.inproc.json" >/dev/null 2>&1
    python3 - "$run/profile.duckdb" "$out/$name.parts.json" "$out/$name.inproc.json" <<'PY'
import json, sys
from pathlib import Path
from orchestrator.metrics.engine import Options, analysis
a, b = (json.loads(Path(p).read_text()) for p in sys.argv[2:4])
print("report keys that differ (parts, in process):", [k for k in a if k != "store" and a[k] != b.get(k)] or "none")
con, _ = analysis(Path(sys.argv[1]), Options())
for table in ("map_done", "map_ranks", "ops_mapped"):
    print(table, [r for (r,) in con.execute(f"SELECT DISTINCT rank FROM {table} ORDER BY rank").fetchall()])
print("outcome:", a.get("outcome", {}).get("line"))
PY
    rm -rf "$run.inproc"
  done
done
# shellcheck disable=SC2009 # a plain listing, to show that nothing is left
ps -eo pid,args | grep -E 'python|nsys|torchrun' | grep -v grep | grep -v device_faults_check || echo "no python, nsys or torchrun process left"
