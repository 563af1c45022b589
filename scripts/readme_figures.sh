#!/usr/bin/env bash
# The two figures of README.md, made again: the default run (deepseek4-tiny, 8 ranks, 200 steps,
# DeepSeek's loss-free bias and sequence-wise balance loss) and the same run with both off, drawn
# by `moe_stats.py plot`; the default run's expert-load heatmap and the balance figure (load
# variance and worst load violation of each layer, both runs) are copied to docs/img/readme/.
#
#   scripts/readme_figures.sh          # about 3 minutes on 2 cores
#   scripts/readme_figures.sh --replot # the figures only, from the runs of an earlier call
#
# Environment: NP (ranks, default 8), OUT (the runs and every figure, default runs/readme).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
out=${OUT:-runs/readme}
mkdir -p "$out"

if [[ ${1:-} != --replot ]]; then
  moe_build moe_rt
  moe_launcher "${NP:-8}"

  echo "run A: no balancing ($out/unbalanced.h5)"
  "${moe_launch[@]}" "$moe_build_dir/moe_rt" --model deepseek4-tiny --overwrite \
    --bias-update-rate 0 --seq-aux-loss-weight 0 --stats "$out/unbalanced.h5" > "$out/unbalanced.log"
  echo "run B: the default run ($out/default.h5)"
  "${moe_launch[@]}" "$moe_build_dir/moe_rt" --model deepseek4-tiny --overwrite \
    --stats "$out/default.h5" > "$out/default.log"
fi

python3 "$moe_root/scripts/moe_stats.py" plot "$out/unbalanced.h5" "$out/default.h5" \
  --label "no balancing" --label "default" --out "$out/plots" > /dev/null
img="$moe_root/docs/img/readme"
mkdir -p "$img"
cp "$out/plots/expert_load_B.png" "$img/expert_load.png"
cp "$out/plots/balance.png" "$img/balance.png"
echo "wrote $img/expert_load.png and $img/balance.png (every figure: $out/plots)"
