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
mapfile -t files < <(git ls-files --cached --others --exclude-standard '*.cpp' '*.hpp' '*.cu' '*.cuh' |
  while read -r f; do [[ -f $f ]] && echo "$f"; done)
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
