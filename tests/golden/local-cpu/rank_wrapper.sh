#!/usr/bin/env bash
# orch rank wrapper for job ddp-cpu (rendered by orch 0.1.0; do not edit).
# torchrun starts this once per rank (--no-python) with the training command as "$@".
# Profiled ranks run under `nsys profile`; every other rank execs the command directly,
# so unprofiled ranks pay nothing.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

rank=${RANK:?RANK is not set: run this script under torchrun}

# in_ranks R LO HI [LO HI ...]: is R inside one of the inclusive ranges?
in_ranks() {
  local r=$1
  shift
  while [ "$#" -ge 2 ]; do
    if [ "$r" -ge "$1" ] && [ "$r" -le "$2" ]; then return 0; fi
    shift 2
  done
  return 1
}

# Profiled ranks: 0-1
if ! in_ranks "$rank" 0 1; then
  # The program keeps this pid: launch.sh asks it for a stack dump when it stops the job.
  if [ -n "${ORCH_CTL_DIR:-}" ]; then echo "$$" > "$ORCH_CTL_DIR/app.r$rank.pid" 2>/dev/null || true; fi
  exec "$@"
fi

nsys_args=( '--trace=nvtx,osrt' --sample=none --cpuctxsw=none --wait=primary --force-overwrite=true)
mkdir -p /orch/run/reports

# nsys can fail while it starts, before the program runs: when several ranks of a node start it
# at the same moment, its agent launch races ("Agent launcher failed", "Local Endpoint is not
# available", "Connection reset by peer"; about 1 start in 30 with nsys 2022.4 on one machine).
# Such an attempt ran nothing, so it is started again. The program's first act is to create a
# marker (a shell builtin: no extra process in the trace), which tells a failed start from a
# program that ran and failed: that one is never run twice. Without a writable marker, no retry.
# The marker holds the program's pid: launch.sh reads it from $ORCH_CTL_DIR (below).
ctl=${ORCH_CTL_DIR:-}
if [ -n "$ctl" ]; then
  started=$ctl/app.r$rank.pid
else
  started=$(mktemp -u "${TMPDIR:-/tmp}/orch-started.XXXXXXXX")
fi
attempts=3
if ! { : > "$started"; } 2>/dev/null; then attempts=1; fi
# nsys can also hang while it starts: its launcher gone, its agent waiting, the program never
# started (nsys 2022.4, several ranks starting it at once on a busy machine), while the peers wait
# in the rendezvous until their timeout. An attempt whose program has not started
# ORCH_NSYS_START_S after nsys did is killed, and counts as a start that failed.
start_s=${ORCH_NSYS_START_S:-120}
rm -f "$started"
# How the capture ends when the job does not end by itself: torchrun passes a stop (the time
# limit's warning, a cancel, another rank's failure) as SIGTERM to this wrapper's process
# group. nsys runs in a session of its own, so that signal does not reach it or the program
# (a program killed before nsys stops loses its NVTX ranges); the wrapper asks nsys to stop
# instead, and nsys ends the program once it has its ranges. launch.sh finds nsys by the pid
# files in $ORCH_CTL_DIR when torchrun killed this wrapper before nsys was done.
# nsys is asked once, and not after the program ended: nsys is then writing its report, and a
# SIGTERM would abort it instead.
# A program nsys left behind (below) is stopped by the wrapper itself, as nsys would have.
# Hence `running` below, not `kill -0`: that would call the ended program's zombie alive and ask
# nsys to stop mid-write (aborting the report, and ending the rank with 143 as if torchrun's
# stop were how it failed).
# running PID: is PID a live process? A program that ended is a zombie until its parent (nsys)
# reaps it, which nsys does only once it wrote the report: it is not running.
running() {
  local st
  [ -n "$1" ] && st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st:0:1}" != Z ]
}
stop=0
asked=0
nsys_pid=""
export_pid=""
orphan=""
stop_capture() {
  stop=1
  if [ -n "$export_pid" ]; then kill -TERM -- "-$export_pid" 2>/dev/null || true; fi
  if [ -n "$orphan" ]; then kill -TERM -- "-$orphan" 2>/dev/null || kill -TERM "$orphan" 2>/dev/null || true; fi
  if [ -z "$nsys_pid" ] || [ "$asked" -eq 1 ]; then return 0; fi
  local app
  app=$(cat "$started" 2>/dev/null || true)
  if [ -z "$app" ] || running "$app"; then
    asked=1
    release "$app"
    kill -TERM "$nsys_pid" 2>/dev/null || true
  fi
}
# release APP: before nsys stops, the program's hook dumps its evidence and ends the NCCL
# kernels that spin for a peer (sitecustomize.py: CUPTI gives nsys no buffer holding a kernel
# still running); it says so in released.r<RANK>. Asked once per stop (launch.sh may have asked
# already), waited for up to ORCH_RELEASE_WAIT_S while the program lives.
release() {
  local app=$1 marker="$ctl/released.r$rank" waited=0
  # `return 0`, never a bare return: in a trap, that returns the interrupted `wait`'s status.
  if [ -z "$ctl" ] || [ -z "$app" ]; then return 0; fi
  if [ ! -e "$marker" ]; then kill -WINCH "$app" 2>/dev/null || return 0; fi
  while [ ! -e "$marker" ] && running "$app" && [ "$waited" -lt $(( ${ORCH_RELEASE_WAIT_S:-10} * 10 )) ]; do
    sleep 0.1 || true
    waited=$((waited + 1))
  done
  return 0
}
trap stop_capture TERM INT HUP

# A program that finished but does not end: its hook writes finished.r<RANK> (its pid, and `ok`,
# `exit:N` or `exception`) once its main module is done; a process still there ORCH_EXIT_GRACE_S
# later hangs in what runs after (a thread it never ends, an atexit handler, the teardown of
# torch.distributed or of the interpreter), where it would hold the job until its time limit. Its
# capture is stopped as a stop does (nsys keeps the ranges, ends the program, writes the report), it
# is recorded as dumps/exit_hang.r<RANK>, and the rank ends as its program did: 0 where it finished
# cleanly.
grace=${ORCH_EXIT_GRACE_S:-0}
fin=""
if [ -n "$ctl" ] && [ "$grace" -gt 0 ]; then fin=$ctl/finished.r$rank; fi
fin_at=""
exit_asked=0
exit_how=""
exit_overdue() {
  local app pid how
  if [ ! -e "$fin" ]; then return 1; fi
  app=$(cat "$started" 2>/dev/null || true)
  read -r pid how < "$fin" || return 1
  if [ -z "$app" ] || [ "$pid" != "$app" ]; then return 1; fi  # another Python of the rank's: not it
  if [ -z "$fin_at" ]; then fin_at=$SECONDS; exit_how=$how; fi
  [ $((SECONDS - fin_at)) -ge "$grace" ] && running "$app"
}
end_exit() {
  exit_asked=1
  asked=1
  echo "orch: rank $rank: its program (pid $(cat "$started" 2>/dev/null || true)) finished ($exit_how) but had" \
       "not exited $grace s later (profile.exit_grace_s): stopping its capture, which ends it" >&2
  if [ -n "${ORCH_DUMP_DIR:-}" ]; then echo "$grace $exit_how" > "$ORCH_DUMP_DIR/exit_hang.r$rank" 2>/dev/null || true; fi
  # The release, as for a stop: a process that never exits never has its CUDA activity handed to
  # nsys (CUPTI's buffers go out at a normal exit), so its kernels would be lost.
  release "$(cat "$started" 2>/dev/null || true)"
  kill -TERM "$nsys_pid" 2>/dev/null || true
}

# nsys first records into a raw stream (.qdstrm, under TMPDIR), then turns it into the report.
# A signal while it does that aborts it and deletes the stream: Slurm sends SIGTERM to every
# process of a step it ends (srun --kill-on-bad-exit after another node's rank failed, scancel,
# the time limit) and SIGKILL KillWait later. So the stream is hard-linked as soon as nsys' agent
# has it open (`nsys --start-agent --session-name=profile-<program>-<nsys pid>` in nsys 2022.4,
# `--session-name profile-<nsys pid>` in 2025), and keep_report.sh makes the report from the
# link when nsys did not.
kept=${TMPDIR:-/tmp}/orch-kept-${ORCH_JOB_ID:-local}-r$rank.qdstrm
# The processes of nsys' session for the nsys of pid $1: its agent, found by its session name.
agents() {
  grep -lszE -- "^(--session-name=)?profile-(.*-)?$1\$" /proc/[0-9]*/cmdline | sed 's|^/proc/||; s|/cmdline$||'
}
link_stream() {
  local proc fd q
  for proc in $(agents "$nsys_pid") "$nsys_pid"; do
    for fd in /proc/"$proc"/fd/*; do
      q=$(readlink "$fd" 2>/dev/null) || continue
      case $q in
        */nsys-report-*.qdstrm)
          if ln -f "$q" "$kept" 2>/dev/null; then
            echo "$q" > "$kept.name"
            return 0
          fi ;;
      esac
    done
  done
  return 1
}
for attempt in $(seq 1 "$attempts"); do
  rc=0
  rm -f "$kept" "$kept.name"
  if [ -n "$fin" ]; then rm -f "$fin"; fin_at=""; fi
  # shellcheck disable=SC2016 # the inner sh expands them
  ORCH_STARTED=$started setsid nsys profile "${nsys_args[@]}" -o '/orch/run/reports/ddp-cpu_%q{ORCH_JOB_ID}_r%q{RANK}_%h.%p' \
    /bin/sh -c 'echo $$ > "$ORCH_STARTED" 2>/dev/null; unset ORCH_STARTED; exec "$@"' orch-rank "$@" &
  nsys_pid=$!
  asked=0
  if [ -n "$ctl" ]; then echo "$nsys_pid" > "$ctl/nsys.r$rank.pid" 2>/dev/null || true; fi
  if [ "$stop" -eq 1 ]; then stop_capture; fi
  # `|| true` on every sleep: torchrun's SIGTERM to the process group kills a sleep too, and under
  # `set -e` its status would end the wrapper before nsys wrote the report.
  t0=$SECONDS
  linked=0
  while kill -0 "$nsys_pid" 2>/dev/null; do
    if [ "$linked" -eq 0 ] && link_stream; then linked=1; fi
    if [ -e "$started" ]; then
      if [ "$linked" -eq 1 ]; then break; fi
    elif [ "$attempts" -gt 1 ] && [ $((SECONDS - t0)) -ge "$start_s" ]; then
      echo "orch: rank $rank: nsys started no program in $start_s s (ORCH_NSYS_START_S): killing it" >&2
      kill -KILL -- "-$nsys_pid" 2>/dev/null || kill -KILL "$nsys_pid" 2>/dev/null || true
      break
    fi
    sleep 0.2 || true
  done
  while kill -0 "$nsys_pid" 2>/dev/null; do
    if [ -z "$fin" ]; then wait "$nsys_pid" || true; continue; fi
    if [ "$exit_asked" -eq 0 ] && [ "$asked" -eq 0 ] && exit_overdue; then end_exit; fi
    sleep 0.5 || true
  done
  wait "$nsys_pid" || rc=$?
  ended=$nsys_pid
  nsys_pid=""  # (a stop from here on has no nsys to ask)
  ran=0
  app=""
  if [ -e "$started" ]; then
    ran=1
    app=$(cat "$started" 2>/dev/null || true)
  elif [ "$attempts" -gt 1 ]; then
    # A start that failed can leave nsys' agent behind, in a session of its own, waiting for a
    # launcher that is gone (nsys 2022.4, for good, holding the rank's output open): it is this
    # attempt's and goes with it. Only where the marker tells a failed start from a program that
    # ran, whose agent may still be turning the stream into the report. SIGTERM first: an agent
    # killed outright can leave nsys' session table locked (docs/failing_jobs.md).
    for proc in $(agents "$ended"); do
      kill -TERM "$proc" 2>/dev/null || continue
      for _ in 1 2 3 4 5 6 7 8 9 10; do running "$proc" || break; sleep 0.2 || true; done
      kill -KILL "$proc" 2>/dev/null || true
    done
  fi
  # nsys can exit while its program runs on: when its agent dies (nsys 2022.4 and 2025 print
  # "Connection to [the] Agent lost." and exit with status 0), the program keeps running outside
  # nsys, in a session of its own. It is still this rank: the wrapper waits for it (torchrun
  # would otherwise count the rank as ended while its program trains on, unseen), and passes a
  # stop to it.
  if [ "$exit_asked" -eq 1 ]; then
    # The program finished before: its status is how it finished, not how nsys ended it.
    case $exit_how in
      ok) rc=0 ;;
      exit:[0-9]*) rc=${exit_how#exit:} ;;
      *) if [ "$rc" -eq 0 ]; then rc=1; fi ;;
    esac
    for _ in 1 2 3 4 5 6 7 8 9 10; do running "$app" || break; sleep 0.5 || true; done
    if running "$app"; then kill -KILL "$app" 2>/dev/null || true; fi
  fi
  if [ "$ran" -eq 1 ] && running "$app" && sleep 1 && running "$app"; then
    echo "orch: rank $rank: nsys exited (status $rc) while its program (pid $app) ran on (nsys' own" \
         "message, if any, is above): waiting for the program, unprofiled from here" >&2
    orphan=$app
    if [ "$stop" -eq 1 ]; then stop_capture; fi
    while running "$app"; do sleep 0.5 || true; done
    orphan=""
  fi
  report=""
  if [ "$ran" -eq 1 ]; then
    report=$(bash "$here/keep_report.sh" "$rank" "$app" "$kept") || true
  else
    rm -f "$kept" "$kept.name"
  fi
  rm -f "$started"
  if [ -n "$ctl" ]; then rm -f "$ctl/nsys.r$rank.pid" "$ctl/released.r$rank" "$ctl/finished.r$rank"; fi
  # The export `orch collect` would make, made here, now (profile.export_in_job): a stop kills it.
  if [ -n "$report" ] && [ "$stop" -eq 0 ]; then
    setsid bash "$here/export_report.sh" "$report" "$rc" &
    export_pid=$!
    while kill -0 "$export_pid" 2>/dev/null; do wait "$export_pid" || true; done
    export_pid=""
  fi
  # Without the marker (attempts 1) nsys' status is all there is. With it, a program that never
  # started is a failed start whatever that status: nsys 2022.4 exits 0 when its agent is lost
  # before the program starts ("Connection to the Agent lost."), and a rank ended 0 that never ran
  # would leave its peers waiting in the rendezvous until their timeout.
  if [ "$ran" -eq 1 ] || [ "$stop" -eq 1 ] || { [ "$rc" -eq 0 ] && [ "$attempts" -eq 1 ]; }; then
    exit "$rc"
  fi
  if [ "$attempt" -lt "$attempts" ]; then
    echo "orch: rank $rank: nsys exited with status $rc before the program started" \
         "(attempt $attempt of $attempts); starting it again" >&2
    sleep "$(( attempt + RANDOM % 3 ))" || true
    if [ "$stop" -eq 1 ]; then exit "$rc"; fi
  fi
done
echo "orch: rank $rank: nsys exited with status $rc before the program started, $attempts time(s);" \
     "its own messages are above" >&2
if [ "$rc" -eq 0 ]; then exit 1; fi  # (the program never ran: no success to report)
exit "$rc"
