#!/usr/bin/env python3
"""Every per-level kernel runs at its level: nothing it calls was compiled for the baseline.

    simd_levels_inlined.py BINARY

model/simd.hpp's MOE_SIMD_KERNEL compiles a kernel three times, as NAME_sse2, NAME_avx2 and
NAME_avx512, and relies on the compiler inlining everything the kernel calls into each of them.
Where it does not (GCC 12 left the four-row lambdas of the attention softmax and the
cross-entropy rows out of line), the wide kernel calls one shared copy compiled for SSE2: the bits
are the same at every width, so no value test can see it, only the clock (the attention forward
at SSE2 width took 42 ms of a 340 ms step instead of 33).

This reads the binary's disassembly (objdump) and fails, naming both, for every call (or tail
call: a jump to another function) from a NAME_avx2 or NAME_avx512 function to a function of the
binary that is not itself of that level; calls through the PLT (the C library's memset and
memcpy) are allowed. Indirect calls and jumps (through a register or the GOT) name no target and
are not checked: the kernels make none. Exits 77 (skipped) where there is nothing to check: no
objdump, or a build without the levels (not GCC on x86-64).
"""
import re
import shutil
import subprocess
import sys

SKIP_CODE = 77
FUNCTION = re.compile(r"^[0-9a-f]+ <(?P<name>.*)>:$")
# A call, or a jump (a tail call) to another function: objdump names a jump inside the function
# as <caller+0x...>.
BRANCH = re.compile(r"\b(?P<op>call|j[a-z]+)q?\s+(?:\*?[0-9a-f]+ )?<(?P<target>.*)>\s*$")
OFFSET = re.compile(r"\+0x[0-9a-f]+$")
LEVEL = re.compile(r"_(?P<level>avx2|avx512)\(")


def level_of(name):
    m = LEVEL.search(name)
    return m.group("level") if m else None


def out_of_level_calls(disassembly):
    """(caller, callee) for each call or tail call from a level function to a non-PLT function
    of another level, and the number of level functions seen."""
    bad, kernels, caller, level = [], 0, None, None
    for line in disassembly.splitlines():
        m = FUNCTION.match(line)
        if m:
            caller = m.group("name")
            level = level_of(caller)
            kernels += level is not None
            continue
        if level is None:
            continue
        branch = BRANCH.search(line)
        if not branch:
            continue
        target = OFFSET.sub("", branch.group("target"))
        if branch.group("op") != "call" and target == caller:
            continue  # a jump inside the function
        if "@plt" in target or level_of(target) == level:
            continue
        bad.append((caller, target))
    return bad, kernels


def main(argv):
    if len(argv) != 2:
        print("usage: simd_levels_inlined.py BINARY", file=sys.stderr)
        return 2
    objdump = shutil.which("objdump")
    if objdump is None:
        print("skipped: no objdump on this machine")
        return SKIP_CODE
    done = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", argv[1]],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"objdump failed on {argv[1]}: {done.stderr.strip()}", file=sys.stderr)
        return 1
    bad, kernels = out_of_level_calls(done.stdout)
    if kernels == 0:
        print(f"skipped: {argv[1]} has no per-level kernels (a build without the x86 levels)")
        return SKIP_CODE
    for caller, target in sorted(set(bad)):
        print(f"{caller} calls {target}, compiled for the baseline: make it inline into the "
              "kernel ([[gnu::always_inline]])")
    print(f"{kernels} per-level kernels, {len(set(bad))} calls out of their level")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
