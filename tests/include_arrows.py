#!/usr/bin/env python3
"""The house's arrows: which part of the tree may #include which (docs/architecture.md).

Every C++ source under the libraries' folders, the tests and the benchmarks is read; each
#include of the project's own, resolved as the compiler finds it (beside the file, then from the
root or tests/), must point along an allowed arrow, name an existing header, and name it without
"..". The parts: comm/, numeric/, io/, model/ (with model/gemm/), the three wings of
runtime/ (options/, output/, run/) and runtime/'s own files (the moe_rt program). Files directly
in runtime/ besides main.cpp belong in a wing. Prints one line per violation and a closing count;
exits 1 on any violation, and when a library's folder is missing or no file was read.
Usage: include_arrows.py [ROOT] (default: this tree).
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
SOURCES = ("*.cpp", "*.cc", "*.cxx", "*.hpp", "*.h", "*.inl", "*.cu", "*.cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
# Where a quoted include is looked up, after the including file's own folder: the root (every
# library's include directory) and tests/ (the test helpers' include directory).
SEARCH = ("", "tests")


def part_of(relative):
    """The part a path (relative to the root, '/'-separated) lies in, or None outside them."""
    parts = relative.split("/")
    if parts[0] == "runtime" and len(parts) > 2:
        return "runtime/" + parts[1]
    return parts[0] if parts[0] in ALLOWED and len(parts) > 1 else None


def resolve(root, path, quote, target):
    """(the included file relative to the root, or None when it is not the project's; a problem
    or None). A quoted include is looked up as the compiler does: beside the including file, then
    in the include directories; <...> only in those (<numeric> is the standard library's: a
    project header is always named with its folder)."""
    if ".." in target.split("/"):
        return None, f"includes {target}: name project headers from the root, without '..'"
    places = [path.parent] if quote == '"' else []
    places += [root / folder for folder in SEARCH]
    for place in places:
        candidate = (place / target).resolve()
        if candidate.is_file() and candidate.is_relative_to(root):
            return candidate.relative_to(root).as_posix(), None
    if "/" in target and target.split("/")[0] in ALLOWED:
        return None, f"includes {target}, which does not exist"
    return None, None  # a system or third-party header


def violations(root):
    root = root.resolve()
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
                    where = f"{relative}:{number}"
                    target, problem = resolve(root, path, match.group(1), match.group(2))
                    if problem:
                        found.append(f"{where}: {problem}")
                        continue
                    target_part = part_of(target) if target else None
                    if target_part is None or target_part == source:
                        continue
                    if target_part not in ALLOWED[source]:
                        found.append(f"{where}: {source}/ may not include {target} "
                                     f"({target_part}/ is not below it)")
    return found, files


def main(argv):
    root = pathlib.Path(argv[1]) if len(argv) > 1 else ROOT  # the tree to check: this one
    missing = [top for top in ("comm", "model", "io", "numeric", "runtime/options",
                               "runtime/output", "runtime/run") if not (root / top).is_dir()]
    if missing:
        print(f"include arrows: no folder {', '.join(missing)} under {root}")
        return 1
    found, files = violations(root)
    for line in found:
        print(line)
    print(f"include arrows: {files} files read, {len(found)} violation(s)")
    return 1 if found or files == 0 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
