"""scripts/setup.sh fails loudly when a required Python package cannot be installed (pyarrow and
tensorboard included: without them their tests would only be skipped). Run with stand-ins: a
Python whose pip fails and that reports pyarrow missing, dpkg-query reporting every Debian package
installed, and apt-get and sudo that must not be called."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETUP = os.path.join(ROOT, "scripts", "setup.sh")


def stand_ins(folder, missing="pyarrow"):
    folder.mkdir()
    scripts = {
        # The module check (a script on stdin) reports `missing` missing; pip fails (its
        # arguments kept in pip_calls); the rest runs the real interpreter.
        "python": f'''#!/bin/bash
if [[ $1 == - ]]; then cat >/dev/null; echo {missing}; exit 0; fi
if [[ $1 == -m && $2 == pip ]]; then
  [[ $3 == --version ]] && exit 0
  echo "${{@:3}}" >> {folder}/pip_calls
  echo "ERROR: Could not find a version that satisfies the requirement {missing}" >&2; exit 1
fi
exec {sys.executable} "$@"
''',
        "dpkg-query": "#!/bin/bash\nprintf 'install ok installed'\n",
        "apt-get": f"#!/bin/bash\necho apt-get \"$@\" >> {folder}/calls\nexit 1\n",
        "sudo": f"#!/bin/bash\necho sudo \"$@\" >> {folder}/calls\nexit 1\n",
    }
    for name, text in scripts.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


def test_a_python_package_that_cannot_be_installed_fails_setup(tmp_path):
    bin_dir = stand_ins(tmp_path / "bin")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               PYTHON=str(bin_dir / "python"), TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", SETUP], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("setup: ")]
    assert errors == [f"setup: error: {bin_dir / 'python'} cannot import pyarrow after the "
                      f"install (required: numpy h5py matplotlib pandas pyarrow tensorboard "
                      f"pytest tokenizers setuptools wheel nbclient nbformat ipykernel mlflow); "
                      f"the log follows"], proc.stderr
    assert "Could not find a version" in proc.stderr          # pip's own reason, from the log
    assert not (bin_dir / "calls").exists()                   # nothing asked of apt or sudo
    assert [p for p in os.listdir(tmp_path) if p.startswith("moe_rt_setup.")] == []


def test_pip_is_asked_for_the_pip_name_of_a_module(tmp_path):
    """The mlflow module comes from pip's mlflow-skinny: both pip calls (the plain one, then the
    user's site-packages) name the package, the error the module."""
    bin_dir = stand_ins(tmp_path / "bin", missing="mlflow")
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}",
               PYTHON=str(bin_dir / "python"), TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", SETUP], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (bin_dir / "pip_calls").read_text().splitlines() == [
        "install -q mlflow-skinny", "install -q --user --break-system-packages mlflow-skinny"]
    assert f"setup: error: {bin_dir / 'python'} cannot import mlflow after" in proc.stderr
