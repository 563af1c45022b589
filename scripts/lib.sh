# Shared by scripts/run.sh, scripts/throughput.sh and scripts/balance_ab.sh (sourced, not run):
# the set-up and Release build of one target, and the mpirun launcher for a rank count.
#
#   moe_root        the repository root
#   moe_build_dir   the build folder: $MOE_RT_BUILD_DIR, else $moe_root/build
#   moe_build T     scripts/setup.sh (quiet when all is installed), then configure (Release) and
#                   build target T in moe_build_dir; silent on success; on failure it shows the
#                   log and exits 1, the message naming the calling script. The folder's other
#                   settings are kept: after scripts/test.sh, build/ treats warnings as errors
#                   (CI's setting), so a local change that warns fails these builds too
#   moe_model_args ARGS...  fills the array moe_model with `--model deepseek4-tiny`, or leaves it
#                   empty when ARGS choose the model themselves (--model or --config)
#   moe_launcher N  fills the array moe_launch with `mpirun -np N` and the options for N ranks:
#                   --oversubscribe only when N exceeds the cores, --bind-to none only when N is
#                   below them (Open MPI binds each rank to one core when N <= 2, where its
#                   cores/ranks threads would share it), and exports Open MPI's run-as-root
#                   variables only as root
moe_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
moe_build_dir=${MOE_RT_BUILD_DIR:-$moe_root/build}

moe_build() {
  local target=$1 me
  me=$(basename "$0")
  bash "$moe_root/scripts/setup.sh"
  mkdir -p "$moe_build_dir"
  if ! cmake -S "$moe_root" -B "$moe_build_dir" -DCMAKE_BUILD_TYPE=Release \
      >"$moe_build_dir/configure.log" 2>&1; then
    cat "$moe_build_dir/configure.log" >&2
    echo "$me: cmake configure failed" >&2
    exit 1
  fi
  if ! cmake --build "$moe_build_dir" -j"$(nproc)" --target "$target" \
      >"$moe_build_dir/build.log" 2>&1; then
    tail -n 40 "$moe_build_dir/build.log" >&2
    echo "$me: build failed" >&2
    exit 1
  fi
}

moe_model_args() {
  local arg
  moe_model=(--model deepseek4-tiny)
  for arg in "$@"; do
    case "$arg" in --model|--model=*|--config|--config=*) moe_model=() ;; esac
  done
}

moe_launcher() {
  local np=$1 cores
  cores=$(nproc)
  moe_launch=(mpirun -np "$np")
  if ((np > cores)); then moe_launch+=(--oversubscribe); fi
  if ((np < cores)); then moe_launch+=(--bind-to none); fi
  if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi
}
