#!/usr/bin/env bash
# The benchmark's GPU-machine half (scripts/bench.py is the CPU half): orch's complete report against `nsys recipe` on the SAME real
# .nsys-rep files, export included, and the export formats nsys offers, timed side by side in
# one call. Needs nsys >= 2024 (recipes, arrowdir/parquetdir) and orch installed; no GPU is
# used by the timing itself, only the reports made on one.
#
#   scripts/bench_recipe.sh REPORT_DIR [OUT_DIR]
#
# Prints one table (seconds per step) and the goal ratios: orch complete / one recipe <= 1.0
# (moonshot <= 0.5), orch complete being `orch analyze` (export, collect and report in one
# process). Results: docs/benchmarks.md.
set -euo pipefail

reports=${1:?usage: bench_recipe.sh REPORT_DIR [OUT_DIR]}
out=${2:-$(mktemp -d -t orch-recipe-XXXXXX)}
nsys=${NSYS:-nsys}
mapfile -t reps < <(find "$reports" -maxdepth 1 -name '*.nsys-rep' | sort)
((${#reps[@]})) || { echo "no .nsys-rep in $reports" >&2; exit 2; }
mkdir -p "$out"
version=$("$nsys" --version | grep -oE '[0-9]{4}\.[0-9]+(\.[0-9]+)?' | head -1)
echo "nsys $version, ${#reps[@]} reports, $(nproc) cores, out $out"

secs() {  # secs LABEL CMD...: run, print "LABEL seconds", keep the log
    local label=$1 t0 t1 log
    shift
    log="$out/$(tr -c 'A-Za-z0-9\n' '_' <<<"$label").log"  # a plain file name
    t0=$(date +%s.%N)
    "$@" >"$log" 2>&1 || echo "  ($label failed: see $log)" >&2
    t1=$(date +%s.%N)
    printf "%-44s %8.2f\n" "$label" "$(awk -v a="$t0" -v b="$t1" "BEGIN { print b - a }")" | tee -a "$out/times.txt"
}

fresh() {  # a fresh copy of the reports: no export or recipe cache is reused
    local d="$out/$1"
    rm -rf "$d" && mkdir -p "$d" && cp "${reps[@]}" "$d/"
    echo "$d"
}

# The tables orch reads: what orch itself asks nsys 2024+ for (store/tables.py).
tables=$(python3 -c 'from orchestrator.store.tables import export_tables; print(",".join(export_tables()))')

# 1. Export formats, every report in parallel (as orch does), with and without --tables.
for fmt in sqlite arrowdir parquetdir; do
    d=$(fresh "export-$fmt")
    secs "export $fmt (all tables)" bash -c "ls '$d'/*.nsys-rep | xargs -P '$(nproc)' -I{} \
        '$nsys' export --type '$fmt' --force-overwrite true -o {}.$fmt {}"
    d=$(fresh "export-$fmt-tables")
    secs "export $fmt (orch's tables)" bash -c "ls '$d'/*.nsys-rep | xargs -P '$(nproc)' -I{} \
        '$nsys' export --type '$fmt' --tables '$tables' --force-overwrite true -o {}.$fmt {}"
    du -sh "$d" | sed "s|^|  size $fmt (orch's tables): |"
done

# 2. orch, complete: export + collect + report (JSON and HTML), in one process (`orch analyze`)
#    and as the two commands, with per-phase timings.
d=$(fresh orch-analyze)
secs "orch analyze (export included)" orch analyze "$d" --out "$out/analyze" --nsys "$nsys" \
    --json "$out/analyze/r.json" --html "$out/analyze/r.html" --timings
d=$(fresh orch)
secs "orch collect + report (export included)" bash -c "orch collect --from '$d' --out '$out/run' \
    --nsys '$nsys' --timings && orch report '$out/run/profile.duckdb' --json '$out/run/r.json' --html '$out/run/r.html'"
secs "nsys export --help (orch's capability probe)" "$nsys" export --help
# the same again with the exports in place: what a second report costs
secs "orch report (store kept)" orch report "$out/run/profile.duckdb" --json "$out/run/r2.json"

# 3. NVIDIA's recipes on the same reports, each alone (its own export and cache included).
for recipe in nccl_gpu_overlap_trace gpu_gaps; do
    d=$(fresh "recipe-$recipe")
    secs "nsys recipe $recipe" "$nsys" recipe "$recipe" --input "$d" --output "$out/$recipe.out" --force-overwrite
done

awk -v OFS='\t' '
    /^orch analyze/ {orch = $NF}
    /^nsys recipe/ {r[$3] = $NF}
    END {for (k in r) printf "goal: orch complete / %s = %.2f (<= 1.0; moonshot <= 0.5)\n", k, orch / r[k]}
' "$out/times.txt"
