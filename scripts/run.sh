#!/usr/bin/env bash
# Set-up, Release build, then the main job: `mpirun -np ${NP:-8} moe_rt --model deepseek4-tiny ...`.
# Usage: scripts/run.sh [moe_rt options]      e.g. NP=2 scripts/run.sh --steps 50 --lr 1e-3
# Adds --oversubscribe only when NP exceeds the cores, and Open MPI's run-as-root variables only
# when running as root.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$moe_root"

moe_build moe_rt
moe_launcher "${NP:-8}"
model=(--model deepseek4-tiny)
for arg in "$@"; do
  case "$arg" in --model|--model=*|--config|--config=*) model=() ;; esac
done
exec "${moe_launch[@]}" "$moe_build_dir/moe_rt" "${model[@]}" "$@"
