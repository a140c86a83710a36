#!/usr/bin/env bash
# orch in-job export for job ddp-slurm-cpu (rendered by orch 0.1.0; do not edit).
# export_report.sh REPORT [STATUS]: the rank wrapper runs it once the rank's report is complete
# and the job is not being stopped; STATUS: how the rank's nsys (its program) exited. `nsys
# export` of this one report to SQLite, on its node and in parallel with every other rank, into
# the run's exports/ under the name `orch collect` looks for (with the options collect asks for),
# so collect takes it as it is instead of exporting it again. Bounded by
# profile.export_timeout_s; a failure or a stop leaves nothing, and the export to collect. With
# profile.map_in_job, the export is then mapped to the run's Parquet parts too.
set -uo pipefail
report=$1
status=${2:-0}
dir=/orch/run/exports
name=$(basename "$report" .nsys-rep)
mkdir -p "$dir" 2>/dev/null || exit 0
# The temp name is collect's own (a later collect removes those of a killed writer by their pid).
tmp=$dir/.$name.tmp-$$-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n').sqlite
log=$(mktemp "${TMPDIR:-/tmp}/orch-export.XXXXXXXX")
trap 'rm -f "$tmp" "$log"; exit 143' TERM INT HUP
trap 'rm -f "$tmp" "$log"' EXIT
nsys_export() {
  timeout -k 10 900 nsys export --type sqlite --force-overwrite true "$@" \
    --output "$tmp" "$report" > "$log" 2>&1
}
started=$SECONDS
newer=()
ok=0
if [ "${#newer[@]}" -gt 0 ] && nsys_export "${newer[@]}"; then
  ok=1
elif { [ "${#newer[@]}" -eq 0 ] || grep -qiE '(unrecogni[sz]ed|unknown|invalid) option' "$log"; } && nsys_export; then
  ok=1
fi
if [ "$ok" -eq 1 ] && [ -s "$tmp" ] && mv -f "$tmp" "$dir/$name.sqlite"; then
  echo "orch: exported $name in $((SECONDS - started)) s on $(hostname): $dir/$name.sqlite" >&2
  # The rank's Parquet parts and statistics (profile.map_in_job), with orch's own Python and
  # only orch on its path (not the job's PYTHONPATH, which loads orch's rank hook); it says what
  # it did in one line. Not there (a container, no shared filesystem): collect maps the rank.
  # A rank that did not exit 0 fails its job: its statistics cut the step it was stopped in.
  py=<PYTHON>
  if [ -x "$py" ]; then
    env -u PYTHONHOME PYTHONPATH=<REPO> timeout -k 10 900 \
      "$py" -s -m orchestrator.collect.jobmap /orch/run "$report" "$status" || true
  else
    echo "orch: $py is not on $(hostname): orch collect will map $name" >&2
  fi
  exit 0
fi
echo "orch: in-job export of $name failed or timed out (900 s); orch collect will export it:" \
     "$(tail -n 1 "$log" 2>/dev/null)" >&2
exit 1
