#!/usr/bin/env bash
# The performance targets of docs/performance.md ("Toward the machine's limit"), measured in
# rounds: each round runs its layouts one after another, so that every ratio compares runs made
# minutes apart on the same machine (a shared virtual machine's speed drifts by 10-30% within a
# day). Per round it prints the layouts' tokens/s and model GFLOP/s, then the derived figures; at
# the end the median and range of each figure over the rounds:
#   (a)  1 rank x 1 thread, deepseek4-tiny: MFU of the sgemm peak, as the run summary prints it
#   (b)  against eager PyTorch (bench/torch_step.py) at 1 and 2 threads, both presets: only with
#        TORCH_PYTHON set to a Python that has torch (each moe_rt run beside a PyTorch run)
#   (c)  1 rank x 2 threads against 1 x 1 (tokens/s)
#   (d)  8 ranks (one thread each) against 1 rank x 2 threads (tokens/s)
#   fine deepseek4-fine's model GFLOP/s against deepseek4-tiny's at 1 x 2, 2 ranks and 8 ranks
# Global batch 8 x 256 tokens (--batch-per-rank 8/ranks), synthetic data, --stats none. Ranks are
# launched as scripts/run.sh launches them (scripts/lib.sh's moe_launcher: --bind-to none below
# the core count, bound to cores at it, --oversubscribe above it).
# Usage: bench/targets.sh [MOE_RT]   (default build/moe_rt; ROUNDS=3 STEPS=20 TORCH_STEPS=23)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/lib.sh
source "$here/../scripts/lib.sh"
bin=${1:-$moe_build_dir/moe_rt}
rounds=${ROUNDS:-3} steps=${STEPS:-20} torch_steps=${TORCH_STEPS:-23}
if [[ ! -x $bin ]]; then
  echo "targets.sh: no moe_rt at $bin (build it, or pass its path)" >&2
  exit 1
fi
if [[ -n ${TORCH_PYTHON:-} ]] && ! "$TORCH_PYTHON" -c 'import torch' 2>/dev/null; then
  echo "targets.sh: TORCH_PYTHON=$TORCH_PYTHON cannot import torch" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# run NAME RANKS THREADS MODEL [STEPS]: one moe_rt run; appends "NAME tokens/s GFLOP/s MFU%" to
# $tmp/round.
run() {
  local name=$1 np=$2 threads=$3 model=$4 n=${5:-$steps} out
  moe_launcher "$np"
  if ! out=$("${moe_launch[@]}" "$bin" --model "$model" --batch-per-rank $((8 / np)) \
      --threads "$threads" --steps "$n" --stats none 2>&1); then
    echo "$out" | tail -n 20 >&2
    echo "targets.sh: moe_rt failed ($name)" >&2
    exit 1
  fi
  echo "$out" | awk -v name="$name" '
    /^summary: / { for (i = 1; i < NF; ++i) if ($(i + 1) == "tokens/s") tps = $i }
    / GFLOP\/s = .* MFU / { gf = $2; mfu = $5; sub(/%/, "", mfu) }
    END {
      if (tps == "" || gf == "") { exit 1 }
      print name, tps, gf, mfu
    }' >>"$tmp/round" || {
    echo "targets.sh: no summary or GFLOP/s line from moe_rt ($name)" >&2
    exit 1
  }
}

# torch NAME THREADS MODEL: one bench/torch_step.py run; appends "NAME tokens/s".
torch() {
  local name=$1 threads=$2 model=$3 out tps
  if ! out=$("$TORCH_PYTHON" "$here/torch_step.py" --model "$model" --threads "$threads" \
      --batch 8 --steps "$torch_steps" 2>&1); then
    echo "$out" | tail -n 20 >&2
    echo "targets.sh: torch_step.py failed ($name)" >&2
    exit 1
  fi
  tps=$(echo "$out" | awk '/^  median .* tokens\/s/ { print $2 }')
  if [[ -z $tps ]]; then
    echo "targets.sh: no tokens/s from torch_step.py ($name)" >&2
    exit 1
  fi
  echo "$name $tps" >>"$tmp/round"
}

: >"$tmp/figures"
for ((r = 1; r <= rounds; ++r)); do
  : >"$tmp/round"
  run tiny_1x1 1 1 deepseek4-tiny
  run tiny_1x2 1 2 deepseek4-tiny
  run tiny_2r 2 1 deepseek4-tiny
  run tiny_8r 8 1 deepseek4-tiny
  run fine_1x2 1 2 deepseek4-fine
  run fine_2r 2 1 deepseek4-fine
  run fine_8r 8 1 deepseek4-fine
  if [[ -n ${TORCH_PYTHON:-} ]]; then
    for model in tiny fine; do
      for t in 1 2; do
        run "${model}_ours_t$t" 1 "$t" "deepseek4-$model" "$torch_steps"
        torch "${model}_torch_t$t" "$t" "deepseek4-$model"
      done
    done
  fi
  echo "round $r"
  sed 's/^/  /' "$tmp/round"
  awk -v r="$r" '
    { tps[$1] = $2; gf[$1] = $3; mfu[$1] = $4 }
    END {
      printf "a_mfu_1x1 %s\n", mfu["tiny_1x1"]
      printf "c_1x2_over_1x1 %.3f\n", tps["tiny_1x2"] / tps["tiny_1x1"]
      printf "d_8r_over_1x2 %.3f\n", tps["tiny_8r"] / tps["tiny_1x2"]
      printf "fine_over_tiny_1x2 %.3f\n", gf["fine_1x2"] / gf["tiny_1x2"]
      printf "fine_over_tiny_2r %.3f\n", gf["fine_2r"] / gf["tiny_2r"]
      printf "fine_over_tiny_8r %.3f\n", gf["fine_8r"] / gf["tiny_8r"]
      split("tiny fine", models, " ")
      for (m = 1; m <= 2; ++m) {
        for (t = 1; t <= 2; ++t) {
          ours = models[m] "_ours_t" t; theirs = models[m] "_torch_t" t
          if (theirs in tps) printf "b_%s_t%d_over_torch %.3f\n", models[m], t, tps[ours] / tps[theirs]
        }
      }
    }' "$tmp/round" | tee -a "$tmp/figures" | sed 's/^/  = /'
done
echo "over $rounds rounds: median [min, max]"
awk '{ v[$1] = v[$1] " " $2; if (!($1 in seen)) { seen[$1] = 1; order[++n] = $1 } }
  END {
    for (i = 1; i <= n; ++i) {
      k = split(substr(v[order[i]], 2), x, " ")
      for (a = 1; a <= k; ++a) for (b = a + 1; b <= k; ++b) if (x[b] < x[a]) { t = x[a]; x[a] = x[b]; x[b] = t }
      med = (k % 2) ? x[(k + 1) / 2] : (x[k / 2] + x[k / 2 + 1]) / 2
      printf "  %-24s %8.3f [%.3f, %.3f]\n", order[i], med, x[1], x[k]
    }
  }' "$tmp/figures"
