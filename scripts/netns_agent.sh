#!/usr/bin/env bash
# Open MPI's remote launch agent for the simulated hosts of scripts/netns_hosts.sh, used in place
# of ssh (plm_rsh_agent). mpirun calls it as `netns_agent.sh [OPTIONS] HOST COMMAND...`, as it
# would call ssh. HOST is a host name of the hostfile, $MOE_NETNS_PREFIX-h<i>, or its address
# 10.77.0.<i+1>; the command runs on host i through `netns_hosts.sh exec i`. Like ssh, the agent
# joins COMMAND into one string for the remote shell.
set -euo pipefail
prefix=${MOE_NETNS_PREFIX:-moe}
while [[ ${1:-} == -* ]]; do shift; done  # ssh-style options (netns_hosts.sh sets none)
host=${1:-}
shift || true
if [[ $host =~ ^${prefix}-h([0-9]+)$ ]]; then
  i=${BASH_REMATCH[1]}
elif [[ $host =~ ^10\.77\.0\.([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 1)); then
  i=$((BASH_REMATCH[1] - 1))
else
  echo "netns_agent: '$host' is not a host of netns_hosts.sh ($prefix-h<i> or 10.77.0.<i+1>)" >&2
  exit 255
fi
exec "$(dirname "${BASH_SOURCE[0]}")/netns_hosts.sh" exec "$i" sh -c "$*"
