#!/usr/bin/env bash
# The A/B experiment of MaxText pull request #4190 on deepseek4-tiny: run A without balancing
# against run B with the loss-free bias update and the sequence-wise balance loss, then the
# per-layer load-variance table (docs/load-balancing.md).
#
#   scripts/balance_ab.sh pr4190    # its regime: --lr 3e-5 --warmup-steps 2, 21 steps
#   scripts/balance_ab.sh preset    # the preset's own learning rate over STEPS (default 400)
#
# Environment: NP (ranks, default 8), STEPS, OUT (output folder, default runs/balance-ab-<regime>),
# DATA (moe_rt's --data for both runs, e.g. tokens:data/python-docs/train.bin from
# scripts/prepare_data.py; default: moe_rt's, synthetic), EXTRA (more moe_rt options for both
# runs). Prints the table for the first and last step and, for the preset regime, the variance of
# both runs every 50 steps: when the bias wins.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No cd: OUT and the default runs/ folder are relative to the caller's directory.
regime=${1:-pr4190}
case "$regime" in
  pr4190) steps=${STEPS:-21}; train=(--lr 3e-5 --warmup-steps 2) ;;
  preset) steps=${STEPS:-400}; train=() ;;
  *) echo "usage: scripts/balance_ab.sh pr4190|preset" >&2; exit 2 ;;
esac
out=${OUT:-runs/balance-ab-$regime}
mkdir -p "$out"

moe_build moe_rt
moe_launcher "${NP:-8}"

common=(--model deepseek4-tiny --steps "$steps" "${train[@]}" --overwrite ${EXTRA:-})
if [[ -n ${DATA:-} ]]; then common+=(--data "$DATA"); fi
echo "run A: no balancing ($out/A.h5)"
"${moe_launch[@]}" "$moe_build_dir/moe_rt" "${common[@]}" --bias-update-rate 0 \
  --seq-aux-loss-weight 0 --stats "$out/A.h5" > "$out/A.log"
echo "run B: --bias-update-rate 0.001 --seq-aux-loss-weight 0.0001 ($out/B.h5)"
"${moe_launch[@]}" "$moe_build_dir/moe_rt" "${common[@]}" --bias-update-rate 0.001 \
  --seq-aux-loss-weight 0.0001 --stats "$out/B.h5" > "$out/B.log"

last=$((steps - 1))
python3 "$moe_root/scripts/moe_stats.py" variance "$out/A.h5" "$out/B.h5" --steps "0,$last" --markdown
if [[ $regime == preset ]]; then
  echo
  echo "summed top-k load variance every 50 steps (A | B | improvement):"
  for ((s = 0; s < steps; s += 50)); do
    python3 "$moe_root/scripts/moe_stats.py" variance "$out/A.h5" "$out/B.h5" --steps "0,$s" --csv |
      awk -F, -v s="$s" '$1 == "TOTAL/AVG" { printf "  step %4d  %14.2f %14.2f %7.2f%%\n", s, $4, $5, $6 }'
  done
fi
