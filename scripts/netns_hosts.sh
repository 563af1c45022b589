#!/usr/bin/env bash
# Simulated hosts on one machine: N Linux network namespaces joined by a private switch, and an
# Open MPI launch over TCP between them. Used by the multihost tests (tests/multihost) and the
# network benchmark (bench/multihost.sh); docs/cluster.md explains the set-up.
#
# Design
#   - Host i is network namespace PREFIX-h<i> with loopback up and one interface eth0, address
#     10.77.0.<i+1>/24. The switch is a bridge br0 in a namespace of its own, PREFIX-br, holding
#     the other ends of the veth pairs (named h<i>) and no address. The root namespace gets no
#     interface and no address, so no packet of the simulated cluster can reach a real network,
#     and two sets with different prefixes (two test runs at once) can use the same subnet.
#   - What runs on host i runs in its network namespace and, like a real host, with its own host
#     name (PREFIX-h<i>, a UTS namespace), its own /dev/shm (a tmpfs in a mount namespace, gone
#     when its last process ends) and an /etc/hosts naming every host (bind-mounted there only).
#     Without these, every namespace would share the machine's host name and /dev/shm, and Open
#     MPI's shared-memory segments, named by host name, job and local rank, collide: local rank 0
#     of host 0 and local rank 0 of host 1 open the same file (a crash in btl vader, seen).
#   - mpirun runs inside host 0 (`exec 0`, or the `mpirun` command below): its out-of-band (OOB)
#     listener is then on 10.77.0.1, which every other host reaches through the bridge. (mpirun in
#     the root namespace would need an address there, a route into the private subnet.)
#   - Open MPI starts its daemons (orted) on the other hosts through scripts/netns_agent.sh, set
#     as plm_rsh_agent in place of ssh: it is called as `agent HOST COMMAND...`, maps the address
#     HOST (a name PREFIX-h<i> or an address) to its host and runs `netns_hosts.sh exec I sh -c
#     "COMMAND..."`. The hostfile names the hosts PREFIX-h<i>, with their slots.
#   - Transport: btl tcp,vader,self. Open MPI's locality is by its own node (hostfile entry):
#     vader (shared memory) serves only ranks of the same host, ranks of different hosts use TCP
#     over 10.77.0.0/24 (btl_tcp_if_include, oob_tcp_if_include). MOE_NETNS_BTL=tcp,self puts
#     same-host ranks on TCP too (over loopback of their namespace).
#   - The hosts share this machine's cores, but Open MPI believes each host's slots are its own
#     cores: ranks would spin on cores other ranks need (a micro step took 118 ms instead of
#     0.8 ms on 2 cores, 2 hosts x 2 ranks). So ranks yield when idle (mpi_yield_when_idle, what
#     mpirun --oversubscribe sets on one host) and are not bound to cores.
#   - A lost host ends the job within seconds, not the OOB's default 8 minutes: keepalive on
#     the daemons' OOB connections after 5 s idle, then 3 probes 2 s apart (a daemon that no
#     longer answers is found lost about 11 s after its last packet; docs/cluster.md, "Faults").
#
# Usage (as root; namespaces need CAP_SYS_ADMIN):
#   netns_hosts.sh check             can namespaces be made here? prints why not, exit 1
#   netns_hosts.sh up N [SLOTS]      N hosts of SLOTS slots each (default 4)
#   netns_hosts.sh down              kill what runs in the namespaces, remove them and the state
#   netns_hosts.sh exec I CMD...     run CMD in host I's namespace, with the launch settings
#   netns_hosts.sh mpirun ARGS...    mpirun in host 0 with the hostfile and the settings above
#   netns_hosts.sh hostfile          print the hostfile's path
#   netns_hosts.sh link I up|down    set host I's link (the switch end of its veth) up or down
#   netns_hosts.sh shape RATE [DELAY]  every host's egress shaped: e.g. 1gbit 200us; `shape off`
#   netns_hosts.sh kill I            SIGKILL every process in host I's namespace
# Environment: MOE_NETNS_PREFIX (default moe; names PREFIX-h<i>, PREFIX-br), MOE_NETNS_DIR (state:
# hostfile; default /tmp/PREFIX-netns), MOE_NETNS_BTL (default tcp,vader,self).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${MOE_NETNS_PREFIX:-moe}
state=${MOE_NETNS_DIR:-/tmp/$prefix-netns}
subnet=10.77.0
me=netns_hosts

die() {
  echo "$me: $*" >&2
  exit 1
}

host_ns() { echo "$prefix-h$1"; }
bridge_ns() { echo "$prefix-br"; }

# The namespaces of this prefix that exist now, hosts first.
our_namespaces() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-(h[0-9]+|br)\$" |
    sort -r || true
}

num_hosts() {
  [[ -f $state/hostfile ]] || die "no hosts are up (no $state/hostfile); run: $0 up N"
  grep -c . "$state/hostfile"
}

check_index() {
  local n
  n=$(num_hosts)
  if [[ ! $1 =~ ^[0-9]+$ ]] || (($1 >= n)); then
    die "host index '$1' is not in 0..$((n - 1))"
  fi
}

cmd_check() {
  [[ $(id -u) -eq 0 ]] || die "not root: network namespaces need CAP_SYS_ADMIN"
  command -v ip >/dev/null || die "no 'ip' command (iproute2)"
  command -v mpirun >/dev/null || die "no mpirun"
  local a="$prefix-probe$$-a" b="$prefix-probe$$-b" why=""
  if ! why=$(ip netns add "$a" 2>&1); then
    die "cannot make a network namespace: $why"
  fi
  if ! why=$(ip netns add "$b" 2>&1 &&
      ip link add p0 netns "$a" type veth peer name p1 netns "$b" 2>&1); then
    ip netns del "$a" 2>/dev/null || true
    ip netns del "$b" 2>/dev/null || true
    die "cannot make a veth pair between namespaces: $why"
  fi
  ip netns del "$a"
  ip netns del "$b"
  echo "$me: network namespaces and veth pairs can be made here"
}

cmd_up() {
  local n=${1:-} slots=${2:-4} i ns br
  if [[ ! $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then
    die "up needs a host count 1..200, got '$n'"
  fi
  if [[ ! $slots =~ ^[0-9]+$ ]] || ((slots < 1)); then
    die "slots must be a positive count, got '$slots'"
  fi
  [[ -z $(our_namespaces) ]] || die "namespaces of prefix '$prefix' exist already; run: $0 down"
  br=$(bridge_ns)
  # Anything that fails half-way removes what was made.
  trap 'echo "$me: up failed; removing what was made" >&2; cmd_down >/dev/null 2>&1' ERR
  mkdir -p "$state"
  : >"$state/hostfile.new"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$state/hosts"
  ip netns add "$br"
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Both ends made straight in their namespaces: no interface ever appears in the root one.
    ip link add eth0 netns "$ns" type veth peer name "h$i" netns "$br"
    ip -n "$br" link set "h$i" master br0
    ip -n "$br" link set "h$i" up
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    echo "$ns slots=$slots" >>"$state/hostfile.new"
    printf '%s\t%s\n' "$subnet.$((i + 1))" "$ns" >>"$state/hosts"
  done
  mv "$state/hostfile.new" "$state/hostfile"
  trap - ERR
  echo "$me: $n hosts up ($prefix-h0..$prefix-h$((n - 1)), $subnet.1..$subnet.$n, $slots slots" \
    "each); hostfile $state/hostfile"
}

# Kills whatever still runs in our namespaces (only processes this set of hosts started there),
# then removes them; their veths and the bridge go with them. Safe to repeat, safe after a
# half-made `up`.
cmd_down() {
  local ns pids
  for ns in $(our_namespaces); do
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [[ -z $pids ]] && break
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      sleep 0.2
    done
    ip netns del "$ns" 2>/dev/null || echo "$me: could not remove namespace $ns" >&2
  done
  rm -rf "$state"
  [[ -z $(our_namespaces) ]] || die "namespaces left: $(our_namespaces | tr '\n' ' ')"
  echo "$me: down (prefix $prefix)"
}

# The Open MPI settings of a launch across the namespaces, as OMPI_MCA_* variables (they reach the
# daemons and ranks too, through the agent's environment).
launch_env() {
  local env=(
    MOE_NETNS_PREFIX="$prefix"
    OMPI_MCA_plm_rsh_agent="$root/scripts/netns_agent.sh"
    OMPI_MCA_plm_rsh_no_tree_spawn=1
    OMPI_MCA_orte_default_hostfile="$state/hostfile"
    OMPI_MCA_btl="${MOE_NETNS_BTL:-tcp,vader,self}"
    OMPI_MCA_btl_tcp_if_include="$subnet.0/24"
    OMPI_MCA_oob_tcp_if_include="$subnet.0/24"
    OMPI_MCA_oob_tcp_keepalive_time=5
    OMPI_MCA_oob_tcp_keepalive_intvl=2
    OMPI_MCA_oob_tcp_keepalive_probes=3
    OMPI_MCA_mpi_yield_when_idle=1
    OMPI_MCA_hwloc_base_binding_policy=none
  )
  if [[ $(id -u) -eq 0 ]]; then
    env+=(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
  fi
  printf '%s\n' "${env[@]}"
}

cmd_exec() {
  local i=${1:-}
  shift || true
  check_index "$i"
  (($#)) || die "exec needs a command"
  local -a env
  mapfile -t env < <(launch_env)
  # New UTS and mount namespaces (mounts private: nothing propagates back), then `_inside`.
  exec ip netns exec "$(host_ns "$i")" unshare --uts --mount --propagation private \
    env "${env[@]}" "$0" _inside "$i" "$@"
}

# Host i's own name, /dev/shm and /etc/hosts, in the namespaces cmd_exec made; then CMD.
cmd_inside() {
  local i=$1
  shift
  hostname "$(host_ns "$i")"
  mount -t tmpfs -o mode=1777 "$prefix-shm" /dev/shm
  mount --bind "$state/hosts" /etc/hosts
  exec "$@"
}

cmd_mpirun() {
  cmd_exec 0 mpirun "$@"
}

cmd_link() {
  local i=${1:-} dir=${2:-}
  check_index "$i"
  [[ $dir == up || $dir == down ]] || die "link needs up or down, got '$dir'"
  ip -n "$(bridge_ns)" link set "h$i" "$dir"
}

cmd_kill() {
  local i=${1:-} pids
  check_index "$i"
  pids=$(ip netns pids "$(host_ns "$i")")
  # shellcheck disable=SC2086
  [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
}

# Shaping on each host's egress (eth0): a packet from host a to host b leaves host a at RATE at
# most and waits DELAY once (one way). With two hosts each sends to the other only, so RATE bounds
# the receive side as well. Traffic within a host (loopback, shared memory) is not shaped.
# netem does both; a kernel without netem (CONFIG_NET_SCH_NETEM off) gets a token bucket (tbf)
# for the rate alone, and a warning that DELAY was not applied.
cmd_shape() {
  local rate=${1:-} delay=${2:-0} n i ns how=netem
  n=$(num_hosts)
  [[ -n $rate ]] || die "shape needs RATE [DELAY] (e.g. 1gbit 200us) or off"
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$i")
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    [[ $rate == off ]] && continue
    # A deep queue: at 25 Gbit/s and 20 us, netem's default of 1000 packets would drop bursts.
    if [[ $how == netem ]] &&
        tc -n "$ns" qdisc add dev eth0 root netem delay "$delay" rate "$rate" limit 100000 \
          2>/dev/null; then
      continue
    fi
    # Burst: one 64 KiB segment-offload packet (veth hands TCP 64 KiB at a time); queue up to
    # 100 ms of traffic before dropping.
    how=tbf
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 100ms
  done
  # One line on standard output says what was applied (bench/multihost.sh names its case by it).
  if [[ $rate == off ]]; then
    echo "shaped: off"
  elif [[ $how == netem ]]; then
    echo "shaped: netem rate $rate delay $delay"
  else
    echo "shaped: tbf rate $rate"
    [[ $delay == 0 ]] || echo "$me: no netem in this kernel: delay $delay NOT applied" >&2
  fi
}

case ${1:-} in
  check) cmd_check ;;
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  mpirun) shift; cmd_mpirun "$@" ;;
  _inside) shift; cmd_inside "$@" ;;
  hostfile) num_hosts >/dev/null; echo "$state/hostfile" ;;
  link) shift; cmd_link "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  shape) shift; cmd_shape "$@" ;;
  *) sed -n '/^# Usage/,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
