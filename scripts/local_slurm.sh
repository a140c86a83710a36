#!/usr/bin/env bash
# A throw-away two-node Slurm cluster on one Debian machine, from Debian's packages
# (slurm-wlm, munge; slurmdbd + mariadb-server for accounting). Everything lives under one
# directory; every daemon it starts is recorded by pid and stopped by pid; traffic stays on
# 127.0.0.1. Run as root (slurmd needs it).
#
#   scripts/local_slurm.sh start [--no-accounting]   start munge, [mariadb, slurmdbd,] slurmctld, node1, node2
#   scripts/local_slurm.sh env                        print `export SLURM_CONF=...` for clients
#   scripts/local_slurm.sh status                     sinfo of the running cluster
#   scripts/local_slurm.sh stop                       stop what start started, remove the directory
#
# ORCH_SLURM_DIR (default /tmp/orch-slurm) and ORCH_SLURM_PORT_BASE (default 17000) choose
# where it lives and which loopback ports it uses (base+1..+2 slurmd, +10 slurmctld,
# +20 slurmdbd, +30 mariadb).
set -eEuo pipefail  # -E: the ERR trap of a failed start also fires in its functions

dir=${ORCH_SLURM_DIR:-/tmp/orch-slurm}
base=${ORCH_SLURM_PORT_BASE:-17000}
cluster=orch
nodes=(node1 node2)
cpus=${ORCH_SLURM_CPUS:-4}

die() { printf 'local_slurm: %s\n' "$*" >&2; exit 1; }
log() { printf 'local_slurm: %s\n' "$*" >&2; }

# bg NAME CMD...: start a daemon in the foreground mode of its own, in the background, and
# record its pid so that stop kills exactly it.
bg() {
  local name=$1
  shift
  setsid "$@" >>"$dir/log/$name.out" 2>&1 </dev/null &
  echo $! >"$dir/pids/$name"
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  wait_up "" "$@"
}

# wait_up DAEMON SECONDS DESCRIPTION CMD...: wait_for, failing at once (with its logs) when the
# daemon started as DAEMON (bg's name) has exited: a daemon that died never answers.
wait_up() {
  local daemon=$1 secs=$2 what=$3
  shift 3
  local deadline=$((SECONDS + secs)) why
  until "$@" >/dev/null 2>&1; do
    why=""
    [ "$SECONDS" -ge "$deadline" ] && why="timed out waiting for $what after $secs s"
    if [ -n "$daemon" ] && ! kill -0 "$(cat "$dir/pids/$daemon")" 2>/dev/null; then
      why="$daemon exited before $what was up"
    fi
    if [ -n "$why" ]; then
      log "$why; logs in $dir/log"
      tail -n 20 "$dir"/log/*.log "$dir"/log/*.out >&2 2>/dev/null || true  # (stdout to stderr first)
      return 1
    fi
    sleep 0.2
  done
}

write_configs() {
  local accounting=$1
  cat >"$dir/etc/slurm.conf" <<EOF
ClusterName=$cluster
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$((base + 10))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state/ctld
SlurmdSpoolDir=$dir/state/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
MpiDefault=none
SwitchType=switch/none
PlugStackConfig=$dir/etc/plugstack.conf
InactiveLimit=0
KillWait=5
SlurmdTimeout=30
NodeName=node1 NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=$cpus RealMemory=4000 State=UNKNOWN
NodeName=node2 NodeAddr=127.0.0.1 Port=$((base + 2)) CPUs=$cpus RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
EOF
  : >"$dir/etc/plugstack.conf"
  if [ "$accounting" = yes ]; then
    cat >>"$dir/etc/slurm.conf" <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((base + 20))
AccountingStoragePass=$dir/munge/munge.socket
EOF
    cat >"$dir/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$((base + 20))
SlurmUser=root
PidFile=$dir/run/slurmdbd.pid
LogFile=$dir/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$((base + 30))
StorageUser=slurm
StoragePass=orchlocal
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$dir/etc/slurmdbd.conf"
  fi
  printf '127.0.0.1 localhost %s\n::1 localhost\n' "${nodes[*]}" >"$dir/etc/hosts"
}

start_mariadb() {
  command -v mariadbd >/dev/null || die "mariadb-server is not installed (scripts/install_system_deps.sh)"
  # A throw-away accounting database: small InnoDB files and no flush at each commit, so that its
  # start writes and syncs little on a disk other work keeps busy.
  local light=(--innodb-buffer-pool-size=32M --innodb-log-file-size=8M --innodb-flush-log-at-trx-commit=0
               --innodb-doublewrite=0 --skip-log-bin --skip-name-resolve)
  mariadb-install-db --user=root --datadir="$dir/db" --auth-root-authentication-method=normal \
    --skip-test-db "${light[@]}" >"$dir/log/mariadb-install.out" 2>&1
  bg mariadbd mariadbd --no-defaults --user=root --datadir="$dir/db" --socket="$dir/run/mysql.sock" \
    --bind-address=127.0.0.1 --port=$((base + 30)) --pid-file="$dir/run/mariadbd.pid" \
    --log-error="$dir/log/mariadbd.log" "${light[@]}"
  wait_up mariadbd 120 mariadb mariadb --no-defaults -S "$dir/run/mysql.sock" -uroot -e 'SELECT 1'
  mariadb --no-defaults -S "$dir/run/mysql.sock" -uroot -e \
    "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'orchlocal';
     CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'orchlocal';
     GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

start() {
  local accounting=yes
  [ "${1:-}" = "--no-accounting" ] && accounting=no
  [ "$(id -u)" -eq 0 ] || die "run as root (slurmd needs it)"
  for b in munged mungekey slurmctld slurmd unshare; do
    command -v "$b" >/dev/null || die "$b not found: run scripts/install_system_deps.sh"
  done
  if [ -d "$dir/pids" ] && [ -n "$(ls -A "$dir/pids" 2>/dev/null)" ]; then
    die "a cluster already runs in $dir; run '$0 stop' first"
  fi
  mkdir -p "$dir"/{etc,log,pids,run,state/ctld,munge,db}
  chmod 0755 "$dir" "$dir/munge"
  write_configs "$accounting"
  export SLURM_CONF=$dir/etc/slurm.conf
  # A failed start stops what it started: nothing is left running.
  trap 'log "start failed; stopping"; stop' ERR

  mungekey -c -f -k "$dir/munge/munge.key" >/dev/null 2>&1 || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
  chmod 0400 "$dir/munge/munge.key"
  bg munged munged -F --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/run/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/seed"
  wait_up munged 10 munge test -S "$dir/munge/munge.socket"

  if [ "$accounting" = yes ]; then
    start_mariadb
    # slurmdbd reads slurmdbd.conf from the directory of $SLURM_CONF.
    bg slurmdbd slurmdbd -D
    wait_up slurmdbd 30 slurmdbd sacctmgr -i list cluster
    sacctmgr -i add cluster "$cluster" >/dev/null 2>&1 || true
  fi

  bg slurmctld slurmctld -D -i -f "$SLURM_CONF"
  wait_up slurmctld 20 slurmctld scontrol ping
  for n in "${nodes[@]}"; do
    mkdir -p "$dir/state/$n"
    # Own hostname and /etc/hosts per node, so `hostname`, nsys' %h and torchrun see nodeN.
    # shellcheck disable=SC2016  # $1..$3 expand in the inner bash
    bg "slurmd-$n" unshare --uts --mount --propagation private -- \
      bash -c 'hostname "$1" && mount --bind "$2" /etc/hosts && exec slurmd -D -N "$1" -f "$3"' \
      _ "$n" "$dir/etc/hosts" "$SLURM_CONF"
  done
  wait_for 30 "both nodes idle" bash -c "[ \"\$(sinfo -h -o '%T' | sort -u)\" = idle ]"
  # Job steps inherit the node's private UTS namespace: remember it, so stop can end every
  # process of this cluster's jobs (and only those), even ones Slurm lost track of.
  local own node_ns
  own=$(readlink /proc/self/ns/uts)
  for n in "${nodes[@]}"; do
    node_ns=$(readlink "/proc/$(cat "$dir/pids/slurmd-$n")/ns/uts")
    # Never record the host's own namespace: stop would then kill far more than ours.
    [ "$node_ns" != "$own" ] && echo "$node_ns" >"$dir/pids/ns-$n"
  done
  trap - ERR
  echo "$accounting" >"$dir/accounting"
  log "cluster '$cluster' up in $dir (accounting: $accounting); export SLURM_CONF=$SLURM_CONF"
}

stop() {
  [ -d "$dir/pids" ] || { log "nothing running in $dir"; return 0; }
  local order=(slurmd-node2 slurmd-node1 slurmctld slurmdbd mariadbd munged) name pid ns p
  # Everything left in our nodes' namespaces (job steps, orphaned ranks) goes first.
  for ns in "$dir"/pids/ns-*; do
    [ -f "$ns" ] || continue
    for p in /proc/[0-9]*; do
      if [ "$(readlink "$p/ns/uts" 2>/dev/null)" = "$(cat "$ns")" ]; then
        kill -KILL "${p#/proc/}" 2>/dev/null || true
      fi
    done
    rm -f "$ns"
  done
  for name in "${order[@]}"; do
    [ -f "$dir/pids/$name" ] || continue
    pid=$(cat "$dir/pids/$name")
    kill -TERM "$pid" 2>/dev/null || true
  done
  for name in "${order[@]}"; do
    [ -f "$dir/pids/$name" ] || continue
    pid=$(cat "$dir/pids/$name")
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$dir/pids/$name"
  done
  rm -rf "$dir"
  log "stopped and removed $dir"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  env) echo "export SLURM_CONF=$dir/etc/slurm.conf" ;;
  status) SLURM_CONF=$dir/etc/slurm.conf sinfo ;;
  *) echo "usage: $0 start [--no-accounting] | stop | env | status" >&2; exit 2 ;;
esac
