#!/usr/bin/env bash
# Set-up, Release build, then the main job: `mpirun -np ${NP:-8} moe_rt --model deepseek4-tiny ...`.
# Usage: scripts/run.sh [moe_rt options]      e.g. NP=2 scripts/run.sh --steps 50 --lr 1e-3
# Adds --oversubscribe only when NP exceeds the cores, and Open MPI's run-as-root variables only
# when running as root.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No cd: relative paths in the options (--config, --stats, --data tokens:PATH) and the default
# runs/ folder are the caller's.

moe_build moe_rt
moe_launcher "${NP:-8}"
moe_model_args "$@"
exec "${moe_launch[@]}" "$moe_build_dir/moe_rt" "${moe_model[@]}" "$@"
