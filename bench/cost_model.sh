#!/usr/bin/env bash
# The cost model of bench/cost_model.py checked against measured runs, then its predictions.
#
#   bench/cost_model.sh [MOE_RT]                   # default: build/moe_rt; about 3 minutes
#
# For deepseek4-tiny and deepseek4-fine: a calibration run (1 rank, 1 thread, 1 sequence), then
# 1 sequence and 1 thread per rank at each of RANKS="2 4 8" (the default run's per-rank batch),
# each STEPS=20 steps with --stats none; then `cost_model.py check` (measured against modelled, per part) and
# `cost_model.py predict` (EP 16, 64, 256 over 25, 100, 400 Gbit/s). Logs go to OUT=runs/cost_model.
# The multi-host cases are bench/multihost.sh's logs: pass them to `cost_model.py check` with
# their link (`--link 25/20`), see docs/performance.md.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

binary=${1:-build/moe_rt}
ranks=${RANKS:-"2 4 8"}
steps=${STEPS:-20}
out=${OUT:-runs/cost_model}
if [[ ! -x $binary ]]; then
  echo "cost_model.sh: no moe_rt binary at $binary (build first, or pass its path)" >&2
  exit 1
fi
mkdir -p "$out"

run() {  # $1 log name, $2 ranks, the rest moe_rt's arguments
  local log=$out/$1.log np=$2
  shift 2
  moe_launcher "$np"
  if ! "${moe_launch[@]}" "$binary" "$@" --steps "$steps" --stats none >"$log" 2>&1; then
    echo "cost_model.sh: run failed, see $log" >&2
    exit 1
  fi
}

for preset in deepseek4-tiny deepseek4-fine; do
  run "$preset-calibration" 1 --model "$preset" --threads 1
  checks=()
  for np in $ranks; do
    run "$preset-w$np" "$np" --model "$preset" --threads 1
    checks+=("$out/$preset-w$np.log")
  done
  echo "== $preset: measured against the model"
  python3 bench/cost_model.py check "$out/$preset-calibration.log" "${checks[@]}" \
    --cores "$(nproc)"
done
echo "== predictions"
python3 bench/cost_model.py predict "$out/deepseek4-tiny-calibration.log" \
  "$out/deepseek4-fine-calibration.log"
