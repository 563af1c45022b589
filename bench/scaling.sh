#!/usr/bin/env bash
# How a step's cost grows: tokens/s, MFU, peak memory per rank and where the step goes, against
# the expert count E at fixed active FLOPs and against the rank count W, at one global batch.
#
#   bench/scaling.sh [MOE_RT]                      # default: build/moe_rt
#
# Cases (every run: synthetic data, --stats none, the first step discarded by moe_rt's median):
#   E sweep   deepseek4-tiny with --experts E (K = 3 and F = 128 stay, so the FLOPs a token costs
#             do not change; the parameters, the router and the exchange's fragments do)
#   fine      deepseek4-fine (E = 64, K = 8, 8 groups / 4 chosen, F = 56)
# each at W ranks with --batch-per-rank GLOBAL_BATCH / W, so every row trains the same tokens.
#
# Environment: EXPERTS="8 16 64 256" RANKS="1 2 4 8" STEPS=12 GLOBAL_BATCH=8 FINE=1 (0: no
# deepseek4-fine rows) OUT=runs/scaling (scaling.tsv, one log per run, scaling.png).
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are left as they are: OpenBLAS only measures the MFU's
# denominator here, and the header of each log names the kernel that ran.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

binary=${1:-build/moe_rt}
experts=${EXPERTS:-"8 16 64 256"}
ranks=${RANKS:-"1 2 4 8"}
steps=${STEPS:-12}
global_batch=${GLOBAL_BATCH:-8}
fine=${FINE:-1}
out=${OUT:-runs/scaling}
die() {
  echo "scaling.sh: $*" >&2
  exit 1
}
[[ -x $binary ]] || die "no moe_rt binary at $binary (build first, or pass its path)"
mkdir -p "$out"
table=$out/scaling.tsv

# One run: prints its row of the table. $1 label, $2 ranks, the rest moe_rt's model arguments.
run_case() {
  local label=$1 np=$2
  shift 2
  if ((global_batch % np != 0)); then
    die "GLOBAL_BATCH=$global_batch is not a multiple of $np ranks"
  fi
  local log="$out/$label-w$np.log"
  moe_launcher "$np"
  "${moe_launch[@]}" "$binary" "$@" --batch-per-rank $((global_batch / np)) --steps "$steps" \
    --stats none >"$log" 2>&1 || die "run failed: $label at $np ranks (see $log)"
  python3 - "$log" "$label" "$np" <<'EOF'
import re, sys
log, label, np_ = sys.argv[1:]
text = open(log).read()
def grab(pattern):
    m = re.search(pattern, text, re.M)
    if not m:
        sys.exit(f"scaling.sh: '{pattern}' not in {log}")
    return m.group(1)
phase = {m.group(1): float(m.group(2))
         for m in re.finditer(r"^  (\w+)\s+([0-9.]+)\s+[0-9.]+\s+[0-9.]+%", text, re.M)}
step = float(grab(r"^  step\s+([0-9.]+)"))
exchange = sum(phase.get(p, 0) for p in ("dispatch", "combine", "dispatch_bwd", "combine_bwd"))
experts = phase.get("experts", 0) + phase.get("experts_bwd", 0)
router = phase.get("router", 0) + phase.get("router_bwd", 0)
params = grab(r"parameters: ([0-9]+ replicated \+ [0-9]+ in experts)")
replicated, in_experts = (int(x) for x in re.findall(r"[0-9]+", params))
print("\t".join([label, np_, grab(r"median ([0-9]+) tokens/s"), grab(r"= ([0-9.]+)% MFU"),
                 grab(r"peak resident ([0-9.]+) MiB"), f"{(replicated + in_experts) / 1e6:.2f}",
                 f"{step:.1f}", f"{experts:.1f}", f"{exchange:.1f}", f"{router:.1f}",
                 f"{phase.get('optimizer', 0):.1f}"]))
EOF
}

printf 'case\tranks\ttokens_per_s\tmfu_pct\tpeak_rss_mib\tparams_m\tstep_ms\texperts_ms\texchange_ms\trouter_ms\toptimizer_ms\n' >"$table"
for e in $experts; do
  for np in $ranks; do
    run_case "E$e" "$np" --model deepseek4-tiny --experts "$e" | tee -a "$table"
  done
done
if [[ $fine == 1 ]]; then
  for np in $ranks; do run_case fine "$np" --model deepseek4-fine | tee -a "$table"; done
fi
echo "table: $table"
python3 bench/scaling_plot.py "$table" "$out/scaling.png"
