#!/usr/bin/env bash
# orch report keeper for job ddp-slurm-cpu (rendered by orch 0.1.0; do not edit).
# keep_report.sh RANK APP_PID KEPT: run by the rank wrapper once its nsys exited, and by
# launch.sh for a rank whose wrapper was killed; running it twice for one rank is harmless.
# Prints the report's path when there is one.
#
# nsys records into a raw stream ($TMPDIR/nsys-report-*.qdstrm), then its agent turns it into the
# report with QdstrmImporter and deletes it. A signal in between (Slurm's SIGTERM to every
# process of a step it ends, its SIGKILL KillWait later, a kill after profile.stop_grace_s)
# aborts that: nsys deletes the stream and writes no report, or is killed with a partial report.
# The wrapper hard-linked the stream as KEPT (its first name in KEPT.name); from it the report is
# made here with nsys' own QdstrmImporter, under the name nsys would have given it.
set -uo pipefail
shopt -s nullglob
r=$1
app=${2:-}
kept=$3
reports=/orch/run/reports
prefix=ddp-slurm-cpu_${ORCH_JOB_ID:-}_r${r}_
stream=$(cat "$kept.name" 2>/dev/null || true)

# nsys' agent may go on importing after nsys itself was killed: wait for it (up to the stop
# grace) before judging the report, so the two never write it at once.
# shellcheck disable=SC2062 # the pattern comes on stdin (grep's own command line must not match)
nsys_importing() {
  [ -n "$stream" ] && grep -qsF -f - /proc/[0-9]*/cmdline <<< "$stream"
}
# nsys (or its injection in the application) may still be writing the stream when the rank's
# wrapper was stopped: wait until no process holds it open either.
stream_open() {
  local fd
  for fd in /proc/[0-9]*/fd/*; do
    case $(readlink "$fd" 2>/dev/null) in "$stream" | "$stream (deleted)" | "$kept") return 0 ;; esac
  done
  return 1
}
until_s=$((SECONDS + ${ORCH_STOP_GRACE_S:-60}))
while { nsys_importing || { [ -n "$stream" ] && stream_open; }; } && [ "$SECONDS" -lt "$until_s" ]; do
  sleep 0.5
done

if [ -n "$app" ]; then have=("$reports/$prefix"*".$app.nsys-rep"); else have=("$reports/$prefix"*.nsys-rep); fi
# nsys deleted its stream and a report is there: nsys finished it (or an earlier run of this did).
if { [ -z "$stream" ] || [ ! -e "$stream" ]; } && [ "${#have[@]}" -gt 0 ] && [ -s "${have[0]}" ]; then
  rm -f "$kept" "$kept.name"
  echo "${have[0]}"
  exit 0
fi
if [ ! -s "$kept" ]; then
  echo "orch: rank $r: report lost: nsys did not write it and no raw stream of it was kept" >&2
  exit 1
fi
importer=$(command -v QdstrmImporter || true)
if [ -z "$importer" ]; then
  nsys_bin=$(readlink -f "$(command -v nsys)" 2>/dev/null || true)
  importer=$(dirname "${nsys_bin:-/}")/../host-linux-x64/QdstrmImporter
fi
out=${have[0]:-$reports/$prefix$(hostname).${app:-0}.nsys-rep}
# Made beside the stream (QdstrmImporter names its output *.nsys-rep), copied next to its final
# name and renamed onto it: collect never sees a part of a report.
made=${kept%.qdstrm}.$$.nsys-rep
part=$out.$$.part
# An import that fails is tried again (up to 3 times, within the stop grace) once the stream has
# not grown for 2 s: a writer this script cannot see may still have been flushing it.
imported() {
  local n size
  for n in 1 2 3; do
    if "$importer" -f -i "$kept" -o "$made" >/dev/null 2>&1 && [ -s "$made" ]; then return 0; fi
    if [ "$n" -eq 3 ] || [ "$SECONDS" -ge "$until_s" ]; then return 1; fi
    size=-1
    while [ "$(stat -c %s "$kept" 2>/dev/null)" != "$size" ] && [ "$SECONDS" -lt "$until_s" ]; do
      size=$(stat -c %s "$kept" 2>/dev/null)
      sleep 2
    done
  done
  return 1
}
if imported && cp "$made" "$part" && mv -f "$part" "$out"; then
  echo "orch: rank $r: nsys was stopped before it finished the report; made it from the raw stream" \
       "with QdstrmImporter: $out" >&2
  rm -f "$kept" "$kept.name" "$made"
  if [ -n "$stream" ]; then rm -f "$stream"; fi
  echo "$out"
  exit 0
fi
rm -f "$part" "$made"
echo "orch: rank $r: report lost: QdstrmImporter could not turn the raw stream into it; the stream" \
     "is kept on $(hostname) as $kept: $importer -i FILE -o REPORT.nsys-rep" >&2
exit 1
