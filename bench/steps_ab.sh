#!/usr/bin/env bash
# Whole deepseek4-tiny steps of two moe_rt binaries, alternating run by run, so that both see the
# same machine (old first in even rounds, new first in odd ones): for comparing a change's cost
# (e.g. the project's GEMM against an OpenBLAS build of an earlier commit). Prints each run's
# median tokens/s (moe_rt's summary line, steps after the first) and, per layout, the median over
# the runs of each binary and their ratio, then the ratio of each round's pair (new/old, the two
# runs next to each other in time) as a median and range: on a machine whose speed drifts between
# runs (a shared virtual machine), the pairs' ratios spread less than the runs do.
# Usage: bench/steps_ab.sh OLD_MOE_RT NEW_MOE_RT [RUNS=3] [STEPS=20]
# Layouts: 1 rank x 1 thread, 1 rank x 2 threads, 2 ranks, 8 ranks (1 sequence per rank); LAYOUTS
# picks some, e.g. LAYOUTS="1 2" for the first two. OLD_ARGS and NEW_ARGS add moe_rt options to
# one side: the same binary twice measures an option's cost (NEW_ARGS="--shadow none").
set -euo pipefail
old=$1 new=$2 runs=${3:-3} steps=${4:-20}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
all_layouts=("1 --threads 1" "1 --threads 2" "2" "8")
layouts=()
for i in ${LAYOUTS:-1 2 3 4}; do layouts+=("${all_layouts[i - 1]}"); done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
for layout in "${layouts[@]}"; do
  read -r np extra <<<"$layout"
  flags=(-np "$np" --bind-to none)
  ((np > $(nproc))) && flags+=(--oversubscribe)
  : >"$tmp/old" && : >"$tmp/new" && : >"$tmp/pairs"
  for ((r = 0; r < runs; ++r)); do
    # Old first in even rounds, new first in odd ones, so that a steady drift favours neither.
    order=(old new)
    ((r % 2)) && order=(new old)
    for which in "${order[@]}"; do
      bin=$old args=${OLD_ARGS:-}
      [[ $which == new ]] && bin=$new args=${NEW_ARGS:-}
      # shellcheck disable=SC2086
      tps=$(mpiexec "${flags[@]}" "$bin" --steps "$steps" --stats none $extra $args |
        sed -n 's/^summary: .* median \([0-9]*\) tokens\/s/\1/p')
      if [[ -z $tps || $tps == 0 ]]; then
        echo "steps_ab.sh: no tokens/s in the summary of $bin (ranks $np ${extra:-} $args)" >&2
        exit 1
      fi
      echo "$tps" >>"$tmp/$which"
      echo "  ranks $np ${extra:-} $which: $tps tokens/s"
    done
    awk -v a="$(tail -n 1 "$tmp/new")" -v b="$(tail -n 1 "$tmp/old")" \
      'BEGIN {printf "%.4f\n", a / b}' >>"$tmp/pairs"
  done
  o=$(median <"$tmp/old") n=$(median <"$tmp/new")
  echo "ranks $np ${extra:-}: old median $o, new median $n tokens/s, new/old $(awk -v a="$n" -v b="$o" 'BEGIN {printf "%.3f", a / b}')"
  echo "ranks $np ${extra:-}: pairs new/old median $(median <"$tmp/pairs"), from $(sort -n "$tmp/pairs" | head -n 1) to $(sort -n "$tmp/pairs" | tail -n 1)"
done
