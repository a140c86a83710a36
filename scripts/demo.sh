#!/usr/bin/env bash
# The demo on the embedded default (this machine, no cluster): set up, then profile the
# example data-parallel job (2 CPU ranks over gloo, rank 1 planted slow) under nsys,
# collect both ranks into one DuckDB store, and print the cross-rank report.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh
runs=${ORCH_RUNS:-$PWD/orch-runs}
out=$(orch submit scripts/examples/local-cpu.yaml --wait --runs "$runs")
echo "$out"
job=$(sed -n 's/^submitted .* as job \([^ ]*\) .*/\1/p' <<<"$out" | head -n 1)
orch collect "$job" --runs "$runs"
run=$(dirname "$(grep -l "\"job_id\": \"$job\"" "$runs"/*/manifest.json | head -n 1)")
orch report "$job" --runs "$runs" --json "$run/report.json" --html "$run/report.html"
echo "demo: report in $run/report.html; the merged store is $run/profile.duckdb (DuckDB, query it with SQL)"
