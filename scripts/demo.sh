#!/usr/bin/env bash
# The demo on the embedded default (this machine, no cluster, no GPU needed): set up, then
# 1. profile the example data-parallel job (2 CPU ranks over gloo, rank 1 planted slow) under
#    nsys, collect both ranks into one DuckDB store, and print the cross-rank report (CPU-only:
#    CPU phases per rank and step);
# 2. analyse the real GPU exports shipped in tests/fixtures/gpu_e2e (2x H200, NCCL, rank 1
#    planted slow), so a newcomer without a GPU sees what orch reports on a GPU job;
# and say where both HTML reports are.
# ORCH_DEMO_SKIP_SETUP=1 skips scripts/setup.sh (already installed); ORCH_RUNS picks the run root.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ -z "${ORCH_DEMO_SKIP_SETUP:-}" ]; then
  bash scripts/setup.sh >/dev/null
fi
# shellcheck source=scripts/venv.sh
. scripts/venv.sh
# This tree's orch (the environment's editable install of this checkout).
orch() { "$py" -m orchestrator.cli "$@"; }

runs=${ORCH_RUNS:-$PWD/orch-runs}
echo "== 1/2: the CPU example, profiled here (2 ranks, rank 1 planted slow)"
out=$(orch submit scripts/examples/local-cpu.yaml --wait --runs "$runs")
echo "$out"
job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' <<<"$out" | head -n 1)
orch collect "$job" --runs "$runs"
run=$(dirname "$(grep -l "\"job_id\": \"$job\"" "$runs"/*/manifest.json | head -n 1)")
orch report "$job" --runs "$runs" --json "$run/report.json" --html "$run/report.html"

echo
echo "== 2/2: real GPU exports shipped with orch (2x H200, NCCL, rank 1 planted slow)"
gpu="$runs/gpu-example-ddp"
rm -rf "$gpu"
orch analyze tests/fixtures/gpu_e2e/ddp_r0_*.sqlite.gz tests/fixtures/gpu_e2e/ddp_r1_*.sqlite.gz \
  --out "$gpu" --json "$gpu/report.json" --html "$gpu/report.html"

echo
echo "demo: CPU report (this machine): $run/report.html"
echo "demo: GPU report (shipped H200 exports): $gpu/report.html"
echo "demo: the merged stores are $run/profile.duckdb and $gpu/profile.duckdb (DuckDB, query them with SQL)"
echo "demo: orch is installed in $VIRTUAL_ENV: run $VIRTUAL_ENV/bin/orch, or first: source $VIRTUAL_ENV/bin/activate"
echo "demo: next, compare values of a knob side by side, e.g. the planted delay:"
echo "      orch sweep scripts/examples/local-cpu.yaml --set launch.args.5=0,20"
