#!/usr/bin/env bash
# Throughput of deepseek4-tiny with natural routing against forced round-robin routing
# (--force-balance round-robin: exactly equal expert loads), at 1, 2 and 8 ranks, and what the
# imbalance of natural routing costs. Set-up and Release build as scripts/run.sh does.
#
# Usage: scripts/throughput.sh [extra moe_rt options]
#   RANKS="1 2 8" STEPS=30 by default; e.g. RANKS="8" STEPS=50 scripts/throughput.sh --seed 7
# Prints one row per (ranks, mode):
#   median tokens/s   moe_rt's summary line: the median over the steps after the first
#   mean max_viol     mean over all steps of the step lines' max_viol column, the worst
#                     (max c − mean c)/mean c over the top-k (or forced) layers: the imbalance
#   cost              1 − natural/forced median tokens/s, on the natural row of each rank count
# The GEMM kernels moe_rt ran (its banner's "GEMM:" line) are printed; --oversubscribe is added only when the ranks exceed the cores,
# --bind-to none only when they are fewer (Open MPI would otherwise bind each rank to one core,
# where its cores/ranks threads would share it), and the run-as-root variables only as root.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# No cd: relative paths in the extra options are the caller's.

moe_build moe_rt

ranks=${RANKS:-"1 2 8"}
steps=${STEPS:-30}
cores=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# mean_violation LOG: "<mean of max_viol> <steps>" from the step lines under the header line.
mean_violation() {
  awk '/max_viol/ && !h {
         for (i = 1; i <= NF; i++) if ($i == "max_viol") c = i
         nf = NF; h = 1; next
       }
       h && NF == nf && $1 ~ /^[0-9]+$/ { s += $c; n++ }
       END { if (n) printf "%.3f %d\n", s / n, n; else print "nan 0" }' "$1"
}

rows=()
kernel=""
moe_model_args "$@"
for np in $ranks; do
  moe_launcher "$np"
  tps_natural="" viol_natural=""
  for mode in natural round-robin; do
    force=none
    [[ $mode == round-robin ]] && force=round-robin
    log="$tmp/np$np-$mode.log"
    if ! "${moe_launch[@]}" "$moe_build_dir/moe_rt" \
        "${moe_model[@]}" --steps "$steps" --force-balance "$force" \
        --stats "$tmp/np$np-$mode.h5" "$@" >"$log" 2>&1; then
      tail -n 30 "$log" >&2
      echo "throughput.sh: moe_rt failed at $np ranks, $mode routing" >&2
      exit 1
    fi
    [[ -z $kernel ]] && kernel=$(grep -m1 -o 'GEMM: .*' "$log" || true)
    tps=$(sed -n 's/.*median \([0-9.]*\) tokens\/s.*/\1/p' "$log" | tail -n 1)
    read -r viol counted < <(mean_violation "$log")
    if [[ -z $tps || $counted -eq 0 ]]; then
      tail -n 30 "$log" >&2
      echo "throughput.sh: no summary or step lines in the output at $np ranks, $mode" >&2
      exit 1
    fi
    if [[ $mode == natural ]]; then
      tps_natural=$tps viol_natural=$viol
    else
      cost=$(awk -v n="$tps_natural" -v f="$tps" 'BEGIN { printf "%.1f%%", 100 * (1 - n / f) }')
      rows+=("$np natural $tps_natural $viol_natural $cost" "$np round-robin $tps $viol -")
    fi
  done
done

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "${moe_model[1]:-the model of: $*}, $steps steps per run; $cpu, $cores cores"
echo "${kernel:-GEMM: unknown}"
printf '%6s  %-12s %10s %14s %18s\n' ranks mode "tokens/s" "mean max_viol" "cost of imbalance"
for row in "${rows[@]}"; do
  read -r np mode t v c <<<"$row"
  printf '%6s  %-12s %10s %14s %18s\n' "$np" "$mode" "$t" "$v" "$c"
done
