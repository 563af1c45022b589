#!/usr/bin/env bash
# Set-up, Release build, then the main job: `mpirun -np ${NP:-8} moe_rt --model deepseek4-tiny ...`.
# Usage: scripts/run.sh [moe_rt options]      e.g. NP=2 scripts/run.sh --steps 50 --lr 1e-3
# Adds --oversubscribe only when NP exceeds the cores, and Open MPI's run-as-root variables only
# when running as root.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

bash scripts/setup.sh
build=${MOE_RT_BUILD_DIR:-$root/build}
mkdir -p "$build"
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >"$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  echo "run.sh: cmake configure failed" >&2
  exit 1
fi
cmake --build "$build" -j"$(nproc)" --target moe_rt >"$build/build.log" 2>&1 || {
  tail -n 40 "$build/build.log" >&2
  echo "run.sh: build failed" >&2
  exit 1
}

np=${NP:-8}
launch=(mpirun -np "$np")
if ((np > $(nproc))); then launch+=(--oversubscribe); fi
# Open MPI binds each rank to one core when np <= 2; fewer ranks than cores should use them all.
if ((np < $(nproc))); then launch+=(--bind-to none); fi
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
model=(--model deepseek4-tiny)
for arg in "$@"; do
  case "$arg" in --model|--model=*|--config|--config=*) model=() ;; esac
done
exec "${launch[@]}" "$build/moe_rt" "${model[@]}" "$@"
