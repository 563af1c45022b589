#!/usr/bin/env bash
# Installs what moe_rt needs to build, test and analyse, only where it is missing.
# Idempotent and quiet when everything is present; any failed install stops with a message.
set -euo pipefail

# Debian packages: compiler tool chain, MPI, BLAS, HDF5, Boost, test and benchmark libraries.
debs=(
  build-essential cmake pkg-config
  openmpi-bin libopenmpi-dev
  libopenblas-dev
  libhdf5-dev hdf5-tools
  libboost-program-options-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3
)

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

# Python analysis tools: numpy, h5py, matplotlib, pytest for the python tests.
py=${PYTHON:-python3}
if ! "$py" -c 'import numpy, h5py, matplotlib, pytest' >/dev/null 2>&1; then
  echo "setup: installing Python packages (numpy h5py matplotlib pytest) for $("$py" -c 'import sys; print(sys.executable)')"
  if ! "$py" -m pip install -q numpy h5py matplotlib pytest >>"$log" 2>&1; then
    # Debian's own python3 refuses pip (PEP 668); its packages are the fallback, and serve only
    # Debian's python3 (checked below when $PYTHON names another interpreter).
    if ! apt_install python3-numpy python3-h5py python3-matplotlib python3-pytest; then
      echo "setup: installing the Python packages failed; log follows" >&2
      tail -n 40 "$log" >&2
      exit 1
    fi
  fi
  "$py" -c 'import numpy, h5py, matplotlib, pytest' ||
    { echo "setup: Python packages still not importable by $py" >&2; exit 1; }
fi
