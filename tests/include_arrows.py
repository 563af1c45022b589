#!/usr/bin/env python3
"""The house's arrows: which part of the tree may #include which (docs/architecture.md).

Every C++ source under the libraries' folders, the tests and the benchmarks is read; each
#include "part/..." of the project's own must point along an allowed arrow, and the header it
names must exist. The parts: comm/, numeric/, io/, model/ (with model/gemm/), the three wings of
runtime/ (options/, output/, run/) and runtime/'s own files (the moe_rt program). Files directly
in runtime/ besides main.cpp belong in a wing. Prints one line per violation and a closing count;
exits 1 on any violation.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# What each part may include besides itself, the arrows one way: runtime -> model -> comm,
# io beside them, numeric under model and io; within runtime, options <- output <- run <- moe_rt.
LIBRARY = {"comm", "numeric", "io", "model", "runtime/options", "runtime/output", "runtime/run"}
ALLOWED = {
    "numeric": set(),
    "comm": set(),
    "io": {"numeric"},
    "model": {"comm", "numeric"},
    "runtime/options": {"comm", "numeric", "io", "model"},
    "runtime/output": {"comm", "numeric", "io", "model", "runtime/options"},
    "runtime/run": {"comm", "numeric", "io", "model", "runtime/options", "runtime/output"},
    "runtime": LIBRARY,
    "tests": LIBRARY,
    "bench": LIBRARY,
}
SOURCES = ("*.cpp", "*.hpp", "*.h", "*.cu", "*.cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def part_of(relative):
    """The part a path (relative to the root, '/'-separated) lies in, or None outside them."""
    parts = relative.split("/")
    if parts[0] == "runtime" and len(parts) > 2:
        return "runtime/" + parts[1]
    return parts[0] if parts[0] in ALLOWED and len(parts) > 1 else None


def violations(root):
    found = []
    files = 0
    for top in ALLOWED:
        if "/" in top:
            continue
        for pattern in SOURCES:
            for path in sorted((root / top).rglob(pattern)):
                relative = path.relative_to(root).as_posix()
                if relative.startswith(("build", "tests/golden")):
                    continue
                files += 1
                source = part_of(relative)
                if source == "runtime" and path.name != "main.cpp":
                    found.append(f"{relative}: a runtime file outside the wings "
                                 "(options/, output/, run/)")
                for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                    match = INCLUDE.match(line)
                    if not match:
                        continue
                    target = match.group(1)
                    target_part = part_of(target)
                    if target_part is None or target_part not in LIBRARY:
                        continue  # a test helper or a header beside the file
                    where = f"{relative}:{number}"
                    if not (root / target).is_file():
                        found.append(f"{where}: includes {target}, which does not exist")
                    elif target_part != source and target_part not in ALLOWED[source]:
                        found.append(f"{where}: {source}/ may not include {target} "
                                     f"({target_part}/ is not below it)")
    return found, files


def main():
    found, files = violations(ROOT)
    for line in found:
        print(line)
    print(f"include arrows: {files} files read, {len(found)} violation(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
