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
#   - The delay switch (MOE_NETNS_SWITCH=delay at `up`), for kernels without netem: instead of the
#     bridge, bench/netdelay runs in PREFIX-br and makes one TUN device per host (t<i>), which
#     `up` moves into host i's namespace as eth0 (same address, same /etc/hosts). netdelay forwards
#     each IPv4 packet to the device of its destination address, DELAY after it read it, and drops
#     anything else; its file descriptors keep working after the move, and the devices vanish
#     when it exits. Its settings are a control file in the state folder (delay_ns, the links
#     that are down), re-read on SIGHUP: `shape` sets the delay and `link` a host's carrier
#     without re-making the hosts. Its log (what it applied, its counters at exit) is
#     $state/netdelay.log; `down` stops it first (SIGTERM) and prints its counters.
#
# Usage (as root; namespaces need CAP_SYS_ADMIN):
#   netns_hosts.sh check             can namespaces be made here? prints why not, exit 1
#   netns_hosts.sh netem-available   does the kernel have netem? one line, exit 0 or 1
#   netns_hosts.sh up N [SLOTS]      N hosts of SLOTS slots each (default 4)
#   netns_hosts.sh down              kill what runs in the namespaces, remove them and the state
#   netns_hosts.sh exec I CMD...     run CMD in host I's namespace, with the launch settings
#   netns_hosts.sh mpirun ARGS...    mpirun in host 0 with the hostfile and the settings above
#   netns_hosts.sh hostfile          print the hostfile's path
#   netns_hosts.sh link I up|down    set host I's link up or down (the switch end of its veth;
#                                    with the delay switch, its carrier, and the switch drops
#                                    what it would send there or receive from there)
#   netns_hosts.sh shape RATE [DELAY]  every host's egress shaped: e.g. 1gbit 200us; RATE off:
#                                    the delay alone; `shape off`: nothing. Prints what it applied
#   netns_hosts.sh kill I            SIGKILL every process in host I's namespace
# Environment: MOE_NETNS_PREFIX (default moe; names PREFIX-h<i>, PREFIX-br), MOE_NETNS_DIR (state:
# hostfile; default /tmp/PREFIX-netns), MOE_NETNS_BTL (default tcp,vader,self), MOE_NETNS_SWITCH
# (at `up` and `check`: veth, the default, or delay: the delay switch), MOE_NETDELAY_BIN (the
# delay switch's binary; default build/bench/netdelay).
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

# The switch of the hosts that are up: veth (bridge) or delay (bench/netdelay).
switch_mode() {
  if [[ -f $state/switch ]]; then cat "$state/switch"; else echo veth; fi
}

# The switch asked for at `up` (and `check`), and the delay switch's binary.
wanted_switch() {
  local mode=${MOE_NETNS_SWITCH:-veth}
  [[ $mode == veth || $mode == delay ]] || die "MOE_NETNS_SWITCH must be veth or delay, got '$mode'"
  echo "$mode"
}
netdelay_bin() { echo "${MOE_NETDELAY_BIN:-$root/build/bench/netdelay}"; }

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
  if [[ $(wanted_switch) == delay ]]; then
    [[ -c /dev/net/tun ]] || die "no /dev/net/tun: the delay switch needs TUN devices"
    [[ -x $(netdelay_bin) ]] ||
      die "the delay switch's binary $(netdelay_bin) is missing (build the target netdelay)"
    echo "$me: network namespaces, veth pairs and the delay switch can be made here"
    return
  fi
  echo "$me: network namespaces and veth pairs can be made here"
}

# Whether the kernel has netem: tried on the loopback of a namespace made for the purpose.
cmd_netem_available() {
  local ns="$prefix-netem$$" why=""
  ip netns add "$ns" || die "cannot make a network namespace to try netem in"
  if why=$(tc -n "$ns" qdisc add dev lo root netem delay 1ms 2>&1); then
    ip netns del "$ns"
    echo "netem: available"
    return 0
  fi
  ip netns del "$ns"
  echo "netem: not available (tc: ${why//$'\n'/ })"
  return 1
}

cmd_up() {
  local n=${1:-} slots=${2:-4} i ns br mode bin
  if [[ ! $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then
    die "up needs a host count 1..200, got '$n'"
  fi
  if [[ ! $slots =~ ^[0-9]+$ ]] || ((slots < 1)); then
    die "slots must be a positive count, got '$slots'"
  fi
  [[ -z $(our_namespaces) ]] || die "namespaces of prefix '$prefix' exist already; run: $0 down"
  mode=$(wanted_switch)
  bin=$(netdelay_bin)
  if [[ $mode == delay && ! -x $bin ]]; then
    die "MOE_NETNS_SWITCH=delay needs the delay switch's binary: $bin is missing (build the" \
      "target netdelay, or set MOE_NETDELAY_BIN)"
  fi
  br=$(bridge_ns)
  # Anything that fails half-way removes what was made.
  trap 'up_failed' ERR
  mkdir -p "$state"
  echo "$mode" >"$state/switch"
  : >"$state/hostfile.new"
  printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$state/hosts"
  ip netns add "$br"
  ip -n "$br" link set lo up
  if [[ $mode == veth ]]; then
    ip -n "$br" link add br0 type bridge
    ip -n "$br" link set br0 up
  else
    start_switch "$n" "$bin"
  fi
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    if [[ $mode == veth ]]; then
      # Both ends made straight in their namespaces: no interface ever appears in the root one.
      ip link add eth0 netns "$ns" type veth peer name "h$i" netns "$br"
      ip -n "$br" link set "h$i" master br0
      ip -n "$br" link set "h$i" up
    else
      ip -n "$br" link set "t$i" netns "$ns"
      ip -n "$ns" link set "t$i" name eth0
    fi
    ip -n "$ns" addr add "$subnet.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    echo "$ns slots=$slots" >>"$state/hostfile.new"
    printf '%s\t%s\n' "$subnet.$((i + 1))" "$ns" >>"$state/hosts"
  done
  mv "$state/hostfile.new" "$state/hostfile"
  trap - ERR
  echo "$me: $n hosts up ($prefix-h0..$prefix-h$((n - 1)), $subnet.1..$subnet.$n, $slots slots" \
    "each$([[ $mode == veth ]] || echo ", delay switch")); hostfile $state/hostfile"
}

up_failed() {
  echo "$me: up failed; removing what was made" >&2
  cmd_down >/dev/null 2>&1 || true
}

# The delay switch for N hosts: netdelay in the switch namespace with devices t0..t<N-1> and
# delay 0, in a session of its own (a Ctrl-C to the caller does not reach it; `down` stops it).
# Called by cmd_up, whose ERR trap does not reach into functions: every failure here is handled.
start_switch() {
  local n=$1 bin=$2 br pid i why
  local -a devices=()
  br=$(bridge_ns)
  for ((i = 0; i < n; i++)); do devices+=("t$i"); done
  if ! printf 'delay_ns 0\ndown\n' >"$state/netdelay.ctl" || ! : >"$state/netdelay.out"; then
    up_failed
    die "cannot write the delay switch's files in $state"
  fi
  ip netns exec "$br" setsid "$bin" --control "$state/netdelay.ctl" "${devices[@]}" \
    </dev/null >"$state/netdelay.out" 2>"$state/netdelay.log" &
  pid=$!  # ip netns exec and setsid exec, not fork: the pid is netdelay's
  for ((i = 0; i < 200; i++)); do
    grep -qx ready "$state/netdelay.out" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if ! grep -qx ready "$state/netdelay.out" ||
      [[ $(ip netns identify "$pid" 2>/dev/null) != "$br" ]]; then
    why=$(grep -v '^netdelay: applied' "$state/netdelay.log" 2>/dev/null | tail -n 3 || true)
    up_failed
    die "the delay switch ($bin) did not start: ${why:-no 'ready' within 10 s}"
  fi
  echo "$pid" >"$state/netdelay.pid" || { up_failed; die "cannot write $state/netdelay.pid"; }
}

# Sets the delay switch's settings (delay_ns N, down I J...), then waits until it has read them.
switch_set() {
  local delay_ns=$1 down=$2 pid lines k last
  pid=$(cat "$state/netdelay.pid")
  kill -0 "$pid" 2>/dev/null ||
    die "the delay switch (netdelay, pid $pid) is not running; see $state/netdelay.log"
  lines=$(wc -l <"$state/netdelay.log")
  printf 'delay_ns %s\ndown %s\n' "$delay_ns" "$down" >"$state/netdelay.ctl.new"
  mv "$state/netdelay.ctl.new" "$state/netdelay.ctl"
  kill -HUP "$pid"
  for ((k = 0; k < 500; k++)); do
    if (($(wc -l <"$state/netdelay.log") > lines)); then
      last=$(tail -n 1 "$state/netdelay.log")
      [[ $last == "netdelay: applied"* ]] || die "the delay switch refused its settings: $last"
      return 0
    fi
    sleep 0.01
  done
  die "the delay switch did not take its new settings within 5 s; see $state/netdelay.log"
}

# One setting of the delay switch's control file.
switch_get() {
  awk -v key="$1" '$1 == key { $1 = ""; sub(/^ /, ""); print }' "$state/netdelay.ctl"
}

# A time as tc writes it (200us, 1.5ms, 0; a bare number is microseconds, as for tc) in ns.
time_ns() {
  [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(ns|us|usec|ms|msec|s|sec|secs)?$ ]] ||
    die "'$1' is not a time (e.g. 200us, 1.5ms, 0)"
  awk -v x="${BASH_REMATCH[1]}" -v unit="${BASH_REMATCH[3]:-us}" 'BEGIN {
    scale = unit == "ns" ? 1 : unit ~ /^us/ ? 1e3 : unit ~ /^ms/ ? 1e6 : 1e9
    printf "%.0f\n", x * scale }'
}

# Kills whatever still runs in our namespaces (only processes this set of hosts started there),
# then removes them; their veths and the bridge go with them. Safe to repeat, safe after a
# half-made `up`.
cmd_down() {
  local ns pids pid="" k
  # The delay switch first, by SIGTERM: its devices go with it, and it says what it forwarded.
  [[ -f $state/netdelay.pid ]] && pid=$(cat "$state/netdelay.pid")
  if [[ -n $pid ]] && [[ $(ip netns identify "$pid" 2>/dev/null) == "$(bridge_ns)" ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    for ((k = 0; k < 50; k++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    grep -h '^netdelay: forwarded' "$state/netdelay.log" 2>/dev/null || true
  fi
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
  if [[ -n $pid ]] && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == netdelay ]]; then
    die "the delay switch (netdelay, pid $pid) still runs"
  fi
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
  if [[ $(switch_mode) == veth ]]; then
    ip -n "$(bridge_ns)" link set "h$i" "$dir"
    return
  fi
  local j
  local -a down=()
  for j in $(switch_get down); do [[ $j == "$i" ]] || down+=("$j"); done
  [[ $dir == up ]] || down+=("$i")
  switch_set "$(switch_get delay_ns)" "${down[*]}"
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
# With the delay switch, a token bucket (tbf) on each eth0 for the rate and the switch for the
# delay. With the bridge, netem does both; a kernel without netem (CONFIG_NET_SCH_NETEM off) gets
# tbf for the rate alone, and a warning that DELAY was not applied. RATE off: no rate limit.
cmd_shape() {
  local rate=${1:-} delay=${2:-0} n i ns how delay_ns applied
  local -a netem
  n=$(num_hosts)
  [[ -n $rate ]] || die "shape needs RATE [DELAY] (e.g. 1gbit 200us, off 200us) or off"
  delay_ns=$(time_ns "$delay")
  how=$([[ $(switch_mode) == delay ]] && echo switch || echo netem)
  for ((i = 0; i < n; i++)); do
    ns=$(host_ns "$i")
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    if [[ $how == netem ]]; then
      [[ $rate == off && $delay_ns == 0 ]] && continue
      netem=(delay "$delay")
      [[ $rate == off ]] || netem+=(rate "$rate")
      # A deep queue: at 25 Gbit/s and 20 us, netem's default of 1000 packets would drop bursts.
      tc -n "$ns" qdisc add dev eth0 root netem "${netem[@]}" limit 100000 2>/dev/null && continue
      how=tbf
    fi
    [[ $rate == off ]] && continue
    # Burst: one 64 KiB segment-offload packet (veth and the delay switch's devices take TCP
    # 64 KiB at a time); queue up to 100 ms of traffic before dropping.
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 100ms
  done
  if [[ $how == switch ]]; then
    switch_set "$delay_ns" "$(switch_get down)"
  fi
  # One line on standard output says what was applied (bench/multihost.sh names its case by it).
  if [[ $rate == off && $delay_ns == 0 ]]; then
    applied="off"
  elif [[ $how == netem ]]; then
    applied="netem$([[ $rate == off ]] || echo " rate $rate") delay $delay"
  elif [[ $how == switch ]]; then
    applied="$([[ $rate == off ]] || echo "tbf rate $rate, ")switch delay $delay"
  else
    applied=$([[ $rate == off ]] && echo off || echo "tbf rate $rate")
    [[ $delay_ns == 0 ]] || echo "$me: no netem in this kernel: delay $delay NOT applied" >&2
  fi
  echo "shaped: $applied"
}

case ${1:-} in
  check) cmd_check ;;
  netem-available) cmd_netem_available ;;
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
