"""tests/include_arrows.py, the check of the house's arrows: it passes on this tree, and names each
kind of violation in a small tree made for the purpose (an include against the arrows, between
runtime's wings, of a header that does not exist, with '..', in <...>, a runtime file outside the
wings)."""
import importlib.util
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(TESTS, "include_arrows.py")
spec = importlib.util.spec_from_file_location("include_arrows", SCRIPT)
include_arrows = importlib.util.module_from_spec(spec)
spec.loader.exec_module(include_arrows)


def write(root, relative, text):
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_this_tree_follows_the_arrows():
    proc = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.endswith(" 0 violation(s)\n")
    files = int(proc.stdout.split("include arrows: ")[1].split(" files")[0])
    assert files > 100  # it read the tree, not an empty folder


def test_each_kind_of_violation_is_named(tmp_path):
    write(tmp_path, "comm/communicator.hpp", "#pragma once\n")
    write(tmp_path, "model/model.hpp", '#include "comm/communicator.hpp"\n')
    write(tmp_path, "model/gemm/gemm.cpp", '#include "model/model.hpp"\n')
    write(tmp_path, "io/reader.cpp", '#include "model/model.hpp"\n')  # io knows no model
    write(tmp_path, "runtime/options/options.hpp", '#include "model/model.hpp"\n')
    write(tmp_path, "runtime/run/train.hpp", '#include "runtime/options/options.hpp"\n')
    write(tmp_path, "runtime/options/presets.cpp", '#include "runtime/run/train.hpp"\n')
    write(tmp_path, "runtime/output/report.cpp", '#include "runtime/output/gone.hpp"\n')
    write(tmp_path, "runtime/main.cpp", '#include "runtime/run/train.hpp"\n')
    write(tmp_path, "runtime/stray.cpp", "int x;\n")
    write(tmp_path, "tests/t.cpp", '#include "runtime/run/train.hpp"\n#include "helper.hpp"\n')
    write(tmp_path, "tests/helper.hpp", "#include <vector>\n#include <numeric>\n")
    # The ways round the plain form: a path with '..', <...>, a stale path, a test header in a
    # library, a file ending .cc.
    write(tmp_path, "runtime/output/report.hpp", '#include "../run/train.hpp"\n')
    write(tmp_path, "runtime/output/records.hpp", "#include <runtime/run/train.hpp>\n")
    write(tmp_path, "model/old.cc", '#include "runtime/train.hpp"\n#include "tests/helper.hpp"\n')
    found, files = include_arrows.violations(tmp_path)
    assert files == 15
    assert sorted(found) == sorted([
        "runtime/output/report.hpp:1: includes ../run/train.hpp: name project headers from the "
        "root, without '..'",
        "runtime/output/records.hpp:1: runtime/output/ may not include runtime/run/train.hpp "
        "(runtime/run/ is not below it)",
        "model/old.cc:1: includes runtime/train.hpp, which does not exist",
        "model/old.cc:2: model/ may not include tests/helper.hpp (tests/ is not below it)",
        "io/reader.cpp:1: io/ may not include model/model.hpp (model/ is not below it)",
        "runtime/options/presets.cpp:1: runtime/options/ may not include runtime/run/train.hpp "
        "(runtime/run/ is not below it)",
        "runtime/output/report.cpp:1: includes runtime/output/gone.hpp, which does not exist",
        "runtime/stray.cpp: a runtime file outside the wings (options/, output/, run/)",
    ])


def test_a_tree_without_the_libraries_or_their_files_fails(tmp_path):
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert "no folder comm, model, io, numeric" in proc.stdout
    for top in ("comm", "model", "io", "numeric", "runtime/options", "runtime/output",
                "runtime/run"):
        (tmp_path / top).mkdir(parents=True)
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stdout == "include arrows: 0 files read, 0 violation(s)\n"


def test_the_architecture_page_lists_every_file_of_each_library():
    """docs/architecture.md's table names each library's files: a file added, moved or renamed
    without the page following fails here."""
    root = os.path.dirname(TESTS)
    with open(os.path.join(root, "docs", "architecture.md"), encoding="utf-8") as f:
        rows = {line.split("|")[1].strip().strip("`"): line
                for line in f if line.startswith("| `")}
    folders = ["numeric/", "comm/", "model/", "model/gemm/", "io/", "runtime/options/",
               "runtime/output/", "runtime/run/", "runtime/"]
    for folder in folders:
        assert folder in rows, f"docs/architecture.md has no row for {folder}"
        names = {os.path.splitext(name)[0] for name in os.listdir(os.path.join(root, folder))
                 if name.endswith((".cpp", ".hpp", ".h"))}
        missing = sorted(name for name in names if f"`{name}`" not in rows[folder])
        assert not missing, f"{folder}: docs/architecture.md does not list {missing}"
