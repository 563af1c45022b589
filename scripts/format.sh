#!/usr/bin/env bash
# Formats every C++ file of the repository with clang-format and the repository's .clang-format,
# or with --check only says which files differ (exit 1), as scripts/test.sh does before building.
# "Of the repository": tracked, or new and not ignored, so that a file not yet added is checked
# before it is committed rather than after.
# Usage: scripts/format.sh [--check]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
if ! command -v clang-format >/dev/null; then
  echo "format.sh: clang-format not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
# A new file inside a CMake build folder that .gitignore does not name (MOE_RT_BUILD_DIR=out)
# is generated code, not the repository's: left out.
patterns=('*.cpp' '*.hpp' '*.cu' '*.cuh')
in_build_folder() { [[ $1 == */* && -f ${1%%/*}/CMakeCache.txt ]]; }
files=()
while IFS= read -r -d '' f; do
  [[ -f $f ]] && files+=("$f")
done < <(git ls-files -z --cached "${patterns[@]}")
while IFS= read -r -d '' f; do
  [[ -f $f ]] && ! in_build_folder "$f" && files+=("$f")
done < <(git ls-files -z --others --exclude-standard "${patterns[@]}")
if [[ ${1:-} == --check ]]; then
  bad=()
  for f in "${files[@]}"; do
    clang-format --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
  done
  if ((${#bad[@]})); then
    echo "format.sh: ${#bad[@]} file(s) differ from .clang-format (run scripts/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} C++ files follow .clang-format ($(clang-format --version | head -1))"
else
  clang-format -i "${files[@]}"
fi
