#!/usr/bin/env bash
# What the network costs: the token exchange (bench_alltoall) and whole training steps (moe_rt's
# phase table) on one host, then across two hosts simulated by network namespaces
# (scripts/netns_hosts.sh) over TCP, unshaped and shaped (rate and one-way delay on each host's
# egress by netem; where the kernel has no netem, the hosts are joined by the delay switch,
# bench/netdelay, which applies the delay, and tbf the rate). docs/cluster.md, "What the network
# costs", holds the figures of one run.
#
# Usage (as root): bench/multihost.sh [OUTDIR]      (default: a new folder under /tmp)
# Environment: STEPS (moe_rt steps per case, default 20), RANKS_PER_HOST (4), SHAPES (the shaped
#   cases, "RATE/DELAY ...", RATE off for the delay alone; default "25gbit/20us 1gbit/200us
#   off/200us"), MOE_RT_BUILD_DIR (build/), MOE_NETNS_SWITCH (veth or delay; default veth where
#   the kernel has netem, else delay).
# Each case's full output is kept in OUTDIR; a summary table is printed at the end, and the delay
# switch's counters (forwarded, dropped, how late) are in OUTDIR/down.txt.
# Everything made (namespaces, qdiscs, the delay switch) is removed on exit, also on failure or
# Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${MOE_RT_BUILD_DIR:-$root/build}
steps=${STEPS:-20}
per_host=${RANKS_PER_HOST:-4}
shapes=${SHAPES:-25gbit/20us 1gbit/200us off/200us}
out=${1:-$(mktemp -d /tmp/moe_multihost_bench.XXXXXX)}
mkdir -p "$out"
hosts="$root/scripts/netns_hosts.sh"
export MOE_NETNS_PREFIX=moebench$$ MOE_NETNS_DIR=$out/netns
# Without netem the delays come from the delay switch (the unshaped two-host cases then cross it
# too, at delay 0).
if [[ -z ${MOE_NETNS_SWITCH:-} ]]; then
  MOE_NETNS_SWITCH=$(bash "$hosts" netem-available >/dev/null && echo veth || echo delay)
fi
export MOE_NETNS_SWITCH MOE_NETDELAY_BIN=${MOE_NETDELAY_BIN:-$build/bench/netdelay}
bins=("$build/moe_rt" "$build/bench/bench_alltoall")
[[ $MOE_NETNS_SWITCH == delay ]] && bins+=("$MOE_NETDELAY_BIN")
for bin in "${bins[@]}"; do
  if [[ ! -x $bin ]]; then
    echo "multihost.sh: $bin missing; build the targets moe_rt, bench_alltoall and netdelay" >&2
    exit 1
  fi
done

bash "$hosts" check >/dev/null
trap 'bash "$hosts" down >"$out/down.txt"' EXIT
trap 'exit 130' INT TERM
bash "$hosts" up 2 "$per_host" >/dev/null
if [[ $MOE_NETNS_SWITCH == delay ]]; then
  echo "== hosts joined by the delay switch (no netem in this kernel): delays by the switch" >&2
else
  echo "== hosts joined by a bridge; shapes by netem where the kernel has it" >&2
fi
np=$((2 * per_host))
# The simulated hosts share this machine's cores, while moe_rt's default gives each host's ranks
# all of them: one thread per rank unless the cores go further.
threads=$(($(nproc) / np > 1 ? $(nproc) / np : 1))
h0="$MOE_NETNS_PREFIX-h0"

# Bytes through host 1's link so far, both directions, counted at its eth0.
link_bytes() {
  ip -n "$MOE_NETNS_PREFIX-h1" -s -j link show eth0 | python3 -c '
import json, sys
s = json.load(sys.stdin)[0]["stats64"]
print(s["rx"]["bytes"] + s["tx"]["bytes"])'
}

# run_case NAME ONE_HOST [MOE_RT_ARGS...]: bench_alltoall on 2 ranks (every row between the two
# crosses a link when they are on two hosts) and on all ranks, then moe_rt on all ranks.
# ONE_HOST=1 puts every rank in host 0 (shared memory between them, as on one real node), else
# per_host on each host. With MOE_RT_ARGS, moe_rt alone (the exchange is another case's).
run_case() {
  local name=$1 one_host=$2 two all
  shift 2
  if ((one_host)); then
    two=(--host "$h0:2") all=(--host "$h0:$np" --oversubscribe)
  else
    two=(--map-by ppr:1:node) all=(--map-by "ppr:$per_host:node")
  fi
  echo "== $name" >&2
  if (($# == 0)); then
    bash "$hosts" mpirun -np 2 "${two[@]}" "$build/bench/bench_alltoall" --max-tokens 1024 \
      >"$out/$name.alltoall2.txt" 2>&1
    bash "$hosts" mpirun -np "$np" "${all[@]}" "$build/bench/bench_alltoall" --max-tokens 1024 \
      >"$out/$name.alltoall.txt" 2>&1
  fi
  local before
  before=$(link_bytes)
  (cd "$out" && bash "$hosts" mpirun -np "$np" "${all[@]}" "$build/moe_rt" \
    --model deepseek4-tiny --steps "$steps" --threads "$threads" --stats "$out/$name.h5" \
    --overwrite "$@") >"$out/$name.moe_rt.txt" 2>&1
  echo $(($(link_bytes) - before)) >"$out/$name.link_bytes"
}

run_case one-host 1
run_case two-hosts 0
# One EP group per host (docs/cluster.md, "Rank layout"): the all-to-alls stay within a host.
run_case "two-hosts-ep$per_host" 0 --ep "$per_host"
cases=(one-host two-hosts "two-hosts-ep$per_host")
for shape in $shapes; do
  applied=$(bash "$hosts" shape "${shape%/*}" "${shape#*/}")
  echo "$applied" >&2
  # Named by what was applied: the rate (unless off) and the delay, if it was applied (netem or
  # the delay switch; a bridge without netem applies the rate alone).
  rate=${shape%/*} delay=${shape#*/}
  case $applied in
    *delay*) name="two-hosts$([[ $rate == off ]] || echo "-$rate")-$delay" ;;
    *) name="two-hosts-$rate" ;;
  esac
  cases+=("$name")
  run_case "$name" 0
done
bash "$hosts" shape off >/dev/null

python3 "$root/bench/multihost_summary.py" "$out" "${cases[@]}"
echo "(full outputs in $out)"
