#!/usr/bin/env bash
# Installs what is missing, builds moe_rt (Release, warnings as errors) and runs every test, then
# the comm and model tests once more with bounds-checked containers.
# Usage: scripts/test.sh [extra ctest arguments, e.g. -R comm]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

bash scripts/setup.sh --tests
# The C++ layout (.clang-format): a file that differs fails before anything is built.
bash scripts/format.sh --check

build=${MOE_RT_BUILD_DIR:-$root/build}
jobs=$(nproc)
mkdir -p "$build"
if ! cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMOE_RT_WERROR=ON -DMOE_RT_BUILD_TESTS=ON \
    >"$build/configure.log" 2>&1; then
  cat "$build/configure.log" >&2
  echo "test.sh: cmake configure failed" >&2
  exit 1
fi
# The dependency summary: every line CMakeLists.txt's moe_report* functions print.
grep -E '^-- +\[(✓|✗|-)\] ' "$build/configure.log" || true
cmake --build "$build" -j"$jobs"

# MPI tests declare how many processors they use, so ctest -j never runs more ranks than fit.
# No test found (a filter matching nothing, tests not built) is a failure, not a pass.
ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs" "$@"

# The comm and model tests again in a checked build: libstdc++'s assertions on (every span and
# vector index bounds-checked, -D_GLIBCXX_ASSERTIONS), unoptimised, so an index one past a
# buffer's end aborts instead of passing unnoticed. About a minute on 2 cores.
checked="$build-checked"
mkdir -p "$checked"
if ! cmake -S . -B "$checked" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-D_GLIBCXX_ASSERTIONS \
    -DMOE_RT_WERROR=ON -DMOE_RT_BUILD_TESTS=ON -DMOE_RT_BUILD_BENCH=OFF \
    >"$checked/configure.log" 2>&1; then
  cat "$checked/configure.log" >&2
  echo "test.sh: cmake configure of the checked build failed" >&2
  exit 1
fi
cmake --build "$checked" -j"$jobs" --target comm_tests comm_mpi_tests model_tests model_mpi_tests
ctest --test-dir "$checked" --output-on-failure --no-tests=error -j"$jobs" -R '^(comm|model)_'
