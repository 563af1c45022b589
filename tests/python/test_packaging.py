"""pyproject.toml: `pip install -e .` into a throwaway virtual environment that sees this Python's
packages, offline (--no-build-isolation --no-deps --no-index: the setuptools already installed
builds it). The installed `moe-stats` command is the command line of scripts/moe_stats.py,
`import moe_stats` and `import moe_stats_lib` work from any folder, and the install leaves nothing
in the work tree that git would track. The wheel of a plain `pip install .` holds exactly
moe_stats.py and every module of moe_stats_lib (an editable install finds them through scripts/
on the path, so it cannot show one left out)."""
import os
import shutil
import site
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")


def clean_env():
    """This environment without what would hide a broken install (PYTHONPATH) or redirect pip."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("PIP_")}
    return dict(env, PIP_DISABLE_PIP_VERSION_CHECK="1")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """The folder of a virtual environment with the repository installed in editable mode."""
    folder = tmp_path_factory.mktemp("venv")
    # --without-pip: the base Python's pip, seen through --system-site-packages, installs; nothing
    # is copied, and Debian's python3 needs no ensurepip (its python3-venv) for it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(folder)], check=True, timeout=60)
    if sys.prefix != sys.base_prefix:      # run from a virtual environment: its packages too
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        (folder / "lib" / version / "site-packages" / "outer.pth").write_text(
            "\n".join(site.getsitepackages()) + "\n")
    proc = subprocess.run([str(folder / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--no-build-isolation", "--no-deps", "--no-index", "-e", ROOT],
                          capture_output=True, text=True, timeout=300, env=clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return folder


def run_in(folder, *argv):
    return subprocess.run([str(a) for a in argv], cwd=folder, capture_output=True, text=True,
                          timeout=120, env=clean_env())


def test_moe_stats_command_is_the_scripts_command_line(venv, run_a, cli, tmp_path):
    command = venv / "bin" / "moe-stats"
    proc = run_in(tmp_path, command, "summary", run_a)
    code, out, err = cli("summary", run_a)
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, out, err)
    assert code == 0 and "per-layer balance" in out

    # Bad input: the same one line and exit code 2 (the entry point passes main's return on).
    missing = tmp_path / "missing.h5"
    proc = run_in(tmp_path, command, "summary", missing)
    code, out, err = cli("summary", missing)
    assert (proc.returncode, proc.stdout, proc.stderr) == (code, out, err)
    assert code == 2 and len(err.splitlines()) == 1


def test_modules_import_from_another_folder(venv, tmp_path):
    check = ("import importlib.metadata as m, moe_stats, moe_stats_lib\n"
             "dist = m.distribution('moe-stats')\n"
             "print(moe_stats.__file__, moe_stats_lib.__file__, dist.locate_file(''), sep='\\n')\n"
             "print(*[e.value for e in dist.entry_points if e.group == 'console_scripts'])\n")
    proc = run_in(tmp_path, venv / "bin" / "python", "-c", check)
    assert proc.returncode == 0, proc.stderr
    module, package, installed_in, entry_points = proc.stdout.splitlines()
    # Editable: the modules are the work tree's files, the metadata is the environment's.
    assert os.path.realpath(module) == os.path.realpath(os.path.join(SCRIPTS, "moe_stats.py"))
    assert os.path.realpath(package) == os.path.realpath(
        os.path.join(SCRIPTS, "moe_stats_lib", "__init__.py"))
    assert os.path.realpath(installed_in).startswith(os.path.realpath(venv) + os.sep)
    assert entry_points == "moe_stats:main"


def test_install_leaves_nothing_in_the_tree(venv):
    # Ignored files included (.gitignore names *.egg-info): the editable install writes its
    # metadata into the venv, not beside the sources.
    left = [os.path.relpath(os.path.join(folder, name), ROOT)
            for folder, names, files in os.walk(ROOT)
            if not os.path.relpath(folder, ROOT).startswith(("build", ".git"))
            for name in names + files
            if name.endswith((".egg-info", ".dist-info")) or name.startswith("__editable__")]
    assert left == []


def test_wheel_holds_the_module_and_the_package(tmp_path):
    # Built from a copy: a build in the work tree writes build/lib and an egg-info there.
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(os.path.join(SCRIPTS, "moe_stats_lib"), source / "scripts" / "moe_stats_lib",
                    ignore=ignore)
    shutil.copy(os.path.join(SCRIPTS, "moe_stats.py"), source / "scripts")
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), source)
    (source / "docs").mkdir()
    shutil.copy(os.path.join(ROOT, "docs", "analysis.md"), source / "docs")      # the readme
    proc = run_in(tmp_path, sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation",
                  "--no-deps", "--no-index", "-w", tmp_path / "wheels", source)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (tmp_path / "wheels").iterdir()
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "moe-stats = moe_stats:main" in archive.read(entry_points).decode().splitlines()
    expected = {"moe_stats.py"} | {
        os.path.relpath(os.path.join(folder, name), SCRIPTS)
        for folder, _, files in os.walk(os.path.join(SCRIPTS, "moe_stats_lib"))
        for name in files if name.endswith(".py")}
    assert {n for n in names if ".dist-info/" not in n} == expected
