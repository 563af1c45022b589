#!/usr/bin/env bash
# A throwaway one-node SLURM on this machine, for trying scripts/slurm/moe_rt.sbatch under a real
# SLURM (tests/slurm; docs/cluster.md, "SLURM"): munged, slurmctld and slurmd, all as root, all
# in a private folder that is removed, with every process the cluster started, when it stops.
#
# Design
#   - Everything lives in one folder made by mktemp (/tmp/moe-slurm.XXXXXX): slurm.conf, a fresh
#     MUNGE key and munged's socket, the controller's state, slurmd's spool, pid and log files.
#     Nothing under /etc or /var is read or written: every SLURM command is given SLURM_CONF (a
#     SLURM command without it looks for /etc/slurm/slurm.conf, then asks DNS for the cluster).
#   - Only this host, over loopback: the node and the controller are the host's own name at
#     127.0.0.1 (the name must be in /etc/hosts, so that nothing asks DNS), the daemons listen on
#     127.0.0.1 only (CommunicationParameters=NoCtldInAddrAny,NoInAddrAny), on two free ports.
#   - One node with MOE_SLURM_CPUS CPUs (default 2), one partition. No cgroups: processes are
#     tracked by their parent links (proctrack/linuxproc), tasks are not bound (task/none).
#   - Quick turns for tests: a requeued job may start again 6 s after it ended (cred_expire=5,
#     the least SLURM accepts; the default is 120 s) and the scheduler looks at pending jobs
#     every second (sched_interval=1; default 60). What cannot be shortened: the controller
#     checks time limits, and sends --signal's warning, every 30 s counted from its start
#     (PERIODIC_TIMEOUT, fixed when SLURM is built).
#   - Stopping (at exit, on SIGTERM/SIGINT/SIGHUP, and when a start fails): cancel every job and
#     wait for them to end, stop slurmd, slurmctld and munged, kill by process id whatever is
#     left of the jobs (a process whose environment names this folder's slurm.conf), remove the
#     folder. A kill -9 of this script cannot clean up: its folder and daemons are left.
#
# Usage (as root):
#   local_cluster.sh COMMAND [ARG...]   start, run COMMAND with SLURM_CONF set, stop; exits with
#                                       COMMAND's status
#   local_cluster.sh                    start, then stop when standard input ends (or a signal)
# Once the node is idle it prints `local_cluster: ready: SLURM_CONF=DIR/slurm.conf`; the logs are
# beside it (slurmctld.log, slurmd.log, munged.stderr). Exit status: 3 when SLURM cannot run here
# (not root, a program missing, the host name not in /etc/hosts, munged does not start; one line
# says why), 1 when the cluster does not come up (the logs' ends are printed), 2 for bad usage.
set -euo pipefail

me=local_cluster
cpus=${MOE_SLURM_CPUS:-2}
dir=
conf=
pids=()      # munged, slurmctld, slurmd: stopped in the reverse order
command_pid=

unavailable() {
  echo "$me: cannot run here: $*" >&2
  exit 3
}

die() {
  echo "$me: $*" >&2
  exit 1
}

# slurm CMD [ARG...]: a SLURM command of this cluster, bounded in time.
slurm() { SLURM_CONF=$conf timeout 10 "$@"; }

# The last lines of each log, for a start that failed.
show_logs() {
  local f
  for f in "$dir"/slurmctld.log "$dir"/slurmd.log "$dir"/*.stderr; do
    [[ -s $f ]] || continue
    echo "--- $f (end)" >&2
    tail -n 15 "$f" >&2
  done
}

# A TCP port nothing on this host uses.
free_port() {
  local port tries
  for ((tries = 0; tries < 100; tries++)); do
    port=$((20000 + RANDOM % 40000))
    if ! ss -Htan "( sport = :$port )" | grep -q .; then
      echo "$port"
      return
    fi
  done
  die "no free TCP port found"
}

# Processes whose environment names this cluster's slurm.conf: jobs and their step daemons.
cluster_processes() {
  local env_file pid
  for env_file in /proc/[0-9]*/environ; do
    pid=${env_file#/proc/}
    pid=${pid%/environ}
    ((pid != $$)) || continue
    if { tr '\0' '\n' <"$env_file"; } 2>/dev/null | grep -qxF "SLURM_CONF=$conf"; then
      echo "$pid"
    fi
  done
}

# wait_gone SECONDS PID...: true once no PID is alive; false when SECONDS pass first.
wait_gone() {
  local limit=$1 i pid alive
  shift
  for ((i = 0; i < limit * 10; i++)); do
    alive=0
    for pid in "$@"; do
      if kill -0 "$pid" 2>/dev/null; then alive=1; fi
    done
    ((alive)) || return 0
    sleep 0.1
  done
  return 1
}

stop() {
  local status=$? i pid end left=()
  trap - EXIT INT TERM HUP
  trap '' PIPE  # whoever reads our output may be gone (a killed test): stop all the same
  set +e
  if [[ -n $command_pid ]] && kill -0 "$command_pid" 2>/dev/null; then
    kill -TERM "$command_pid"
    wait_gone 10 "$command_pid" || kill -KILL "$command_pid" 2>/dev/null
  fi
  if [[ -n $conf && -f $conf ]] && ((${#pids[@]} >= 2)) && kill -0 "${pids[1]}" 2>/dev/null; then
    slurm scancel --user=root --quiet 2>/dev/null
    end=$((SECONDS + 15))  # for the jobs to end (KillWait is 5 s)
    while ((SECONDS < end)) && [[ -n $(slurm squeue -h -o %i 2>/dev/null) ]]; do sleep 0.1; done
  fi
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null
    wait_gone 10 "${pids[i]}" || kill -KILL "${pids[i]}" 2>/dev/null
    wait "${pids[i]}" 2>/dev/null
  done
  if [[ -n $conf ]]; then
    mapfile -t left < <(cluster_processes)
    if ((${#left[@]})); then
      echo "$me: killing what is left of the jobs: ${left[*]}" >&2
      for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null; done
      wait_gone 5 "${left[@]}"
    fi
  fi
  [[ -n $dir ]] && rm -rf "$dir"
  exit "$status"
}

if [[ ${1:-} == -h || ${1:-} == --help ]]; then
  sed -n '/^# Usage/,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
[[ $cpus =~ ^[1-9][0-9]*$ ]] || { echo "$me: MOE_SLURM_CPUS must be a positive count" >&2; exit 2; }
(($(id -u) == 0)) || unavailable "needs root (munged, slurmctld and slurmd run as root)"
for program in munged munge unmunge slurmctld slurmd sbatch squeue sinfo scontrol scancel ss \
  timeout; do
  command -v "$program" >/dev/null ||
    unavailable "no $program (Debian: apt-get install slurm-wlm munge; scripts/setup.sh --tests)"
done
node=$(hostname -s)
getent -s files hosts "$node" >/dev/null ||
  unavailable "the host name '$node' is not in /etc/hosts (SLURM would ask DNS for it)"

trap stop EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
trap 'exit 129' HUP

dir=$(mktemp -d /tmp/moe-slurm.XXXXXX)
chmod 755 "$dir"  # munged: every user must be able to reach its socket
mkdir "$dir/state" "$dir/spool"
conf=$dir/slurm.conf

head -c 1024 /dev/urandom >"$dir/munge.key"
chmod 600 "$dir/munge.key"
munge_socket=$dir/munge.socket
munged --foreground --socket="$munge_socket" --key-file="$dir/munge.key" \
  --pid-file="$dir/munged.pid" --seed-file="$dir/munged.seed" \
  --origin=127.0.0.1 2>"$dir/munged.stderr" &
pids+=($!)
for ((i = 0; i < 100; i++)); do
  [[ -S $munge_socket ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || break
  sleep 0.1
done
if ! munge -n -S "$munge_socket" 2>/dev/null | unmunge -S "$munge_socket" >/dev/null 2>&1; then
  why=$(grep -i error "$dir/munged.stderr" 2>/dev/null | tail -n 1)
  unavailable "munged did not start${why:+: $why}"
fi

ctld_port=$(free_port)
slurmd_port=$(free_port)
while ((slurmd_port == ctld_port)); do slurmd_port=$(free_port); done
cat >"$conf" <<EOF
# Written by scripts/slurm/local_cluster.sh: a one-node cluster on this host, removed at its end.
ClusterName=moe-local
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$munge_socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=debug2
SlurmdDebug=info
LogTimeFormat=iso8601_ms
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
JobRequeue=1
ReturnToService=2
MessageTimeout=5
SlurmctldTimeout=10
SlurmdTimeout=30
KillWait=5
MinJobAge=300
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

SLURM_CONF=$conf slurmctld -D 2>"$dir/slurmctld.stderr" &
pids+=($!)
SLURM_CONF=$conf slurmd -D 2>"$dir/slurmd.stderr" &
pids+=($!)
state=
end=$((SECONDS + 30))  # for the node to register
while ((SECONDS < end)); do
  state=$(slurm sinfo -h -o %T 2>/dev/null || true)
  [[ $state == idle ]] && break
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || { show_logs; die "a daemon (pid $pid) exited while starting"; }
  done
  sleep 0.1
done
[[ $state == idle ]] || { show_logs; die "the node is not idle after 30 s (state: '${state}')"; }
echo "$me: ready: SLURM_CONF=$conf"

if (($#)); then
  SLURM_CONF=$conf "$@" <&0 &
  command_pid=$!
  wait "$command_pid" && status=0 || status=$?
  command_pid=
  exit "$status"
fi
while read -r _; do :; done
