#!/usr/bin/env bash
# Installs what moe_rt needs to build, test and analyse, only where it is missing.
# Idempotent and quiet when everything is present; any failed install stops with a message.
#   scripts/setup.sh           what builds, runs and analyses (scripts/run.sh)
#   scripts/setup.sh --tests   also what only the tests need (scripts/test.sh): SLURM and MUNGE
set -euo pipefail
case ${1:-} in
  "") tests=0 ;;
  --tests) tests=1 ;;
  *) echo "usage: scripts/setup.sh [--tests]" >&2; exit 2 ;;
esac

# Debian packages: compiler tool chain and clang-format (the C++ layout, checked by
# scripts/format.sh), MPI, BLAS, HDF5, Boost, toml++ (config files), test and benchmark
# libraries, iproute2 (ip and tc: the simulated hosts of the multi-host tests,
# scripts/netns_hosts.sh), iputils-ping (their round trips through the delay switch), and
# python3-doc: the Python documentation's plain-text
# sources (about 11 MB of English, PSF License), the default corpus of scripts/prepare_data.py,
# installed here so that nothing is downloaded when the data is prepared; python3-venv (ensurepip:
# a virtual environment to `pip install -e .` the analysis package into, docs/analysis.md).
debs=(
  build-essential cmake pkg-config clang-format
  openmpi-bin libopenmpi-dev
  libopenblas-dev
  libhdf5-dev hdf5-tools
  libboost-program-options-dev libtomlplusplus-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-doc python3-venv
  iproute2 iputils-ping
)
# With --tests: slurm-wlm and munge, a one-node SLURM for the batch recipe's test
# (scripts/slurm/local_cluster.sh starts its own daemons, with a configuration of its own; on a
# systemd machine the packages also enable the system's munge service).
if ((tests)); then debs+=(slurm-wlm munge); fi

# Install logs: private to this run, removed on success, shown on failure.
log=$(mktemp "${TMPDIR:-/tmp}/moe_rt_setup.XXXXXX")
trap 'rm -f "$log"' EXIT
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi

# apt-get update, then install the Debian packages named; false (log kept) on failure.
apt_install() {
  "${sudo_cmd[@]}" apt-get update -qq >>"$log" 2>&1 &&
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
      --no-install-recommends "$@" >>"$log" 2>&1
}

missing=()
for p in "${debs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  if ! apt_install "${missing[@]}"; then
    echo "setup: apt-get failed; its log follows" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
fi

# Python analysis tools (scripts/moe_stats.py) and the python tests: numpy, h5py, matplotlib,
# pandas (export), pyarrow (export --format parquet), tensorboard (its event writer and reader),
# pytest; tokenizers (Hugging Face's, for scripts/prepare_data.py's BPE tokenizer); setuptools
# and wheel (build pyproject.toml's package offline: tests/python/test_packaging.py; setuptools
# before 70.1, as a pyenv Python 3.11 brings, has no bdist_wheel of its own), nbclient, nbformat
# and ipykernel (run docs/notebooks/: tests/python/test_notebook.py); mlflow (the mlflow command
# and its test: pip's mlflow-skinny, MLflow's client and file store without its server). Import
# names are pip names except those of pip_name.
py=${PYTHON:-python3}
py_modules=(numpy h5py matplotlib pandas pyarrow tensorboard pytest tokenizers
            setuptools wheel nbclient nbformat ipykernel mlflow)
declare -A pip_name=([mlflow]=mlflow-skinny)
pip_names() {  # the pip names of the modules given, space-separated
  local m names=()
  for m in "$@"; do names+=("${pip_name[$m]:-$m}"); done
  echo "${names[*]}"
}
py_missing() {  # the modules of py_modules that $py cannot import, space-separated
  "$py" - "${py_modules[@]}" <<'PY'
import importlib.util, sys
print(" ".join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))
PY
}
missing_py=$(py_missing)
if [[ -n "$missing_py" ]]; then
  echo "setup: installing Python packages ($missing_py) for $("$py" -c 'import sys; print(sys.executable)')"
  # shellcheck disable=SC2086,SC2046  # the names are single words
  if ! "$py" -m pip install -q $(pip_names $missing_py) >>"$log" 2>&1; then
    # Debian's own python3 refuses pip (PEP 668) or has none: Debian's packages first, for the
    # modules Debian packages; they serve only Debian's python3 (checked below when $PYTHON
    # names another interpreter).
    debian_py=()
    for m in $missing_py; do
      case "$m" in
        numpy|h5py|matplotlib|pandas|pytest|setuptools|wheel|nbclient|nbformat|ipykernel)
          debian_py+=("python3-$m") ;;
      esac
    done
    if ((${#debian_py[@]})) && ! apt_install "${debian_py[@]}"; then
      echo "setup: installing the Python packages failed; log follows" >&2
      tail -n 40 "$log" >&2
      exit 1
    fi
    # Debian 12 packages neither pyarrow, tensorboard, tokenizers nor mlflow: pip into the user's
    # site-packages (~/.local), which leaves Debian's own files alone. All are required
    # (checked below): without pyarrow or tensorboard, export --format parquet and the
    # tensorboard command could not run, and their tests would only be skipped.
    # shellcheck disable=SC2046
    rest=$(pip_names $(py_missing))
    # Debian 12's numpy is 1.24; pyarrow 19 and later need numpy 2 (seen: "pyarrow requires NumPy
    # 2.0 or newer"), so take the last release built for numpy 1 there.
    if [[ " $rest " == *" pyarrow "* ]] &&
        "$py" -c 'import numpy, sys; sys.exit(int(numpy.__version__.split(".")[0]) >= 2)' 2>/dev/null; then
      rest=${rest/pyarrow/pyarrow<19}
    fi
    if [[ -n "$rest" ]]; then
      if ! "$py" -m pip --version >/dev/null 2>&1; then apt_install python3-pip || true; fi
      # shellcheck disable=SC2086
      "$py" -m pip install -q --user --break-system-packages $rest >>"$log" 2>&1 || true
    fi
  fi
  # Every module must import (pip may install a wheel that then fails to load).
  still=$(py_missing)
  if [[ -n "$still" ]] || ! "$py" -c "import $(IFS=,; echo "${py_modules[*]}")" >>"$log" 2>&1; then
    echo "setup: error: $py cannot import ${still:-every required Python package}" \
      "after the install (required: ${py_modules[*]}); the log follows" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
fi
