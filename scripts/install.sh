#!/usr/bin/env bash
# Creates (or reuses) the virtual environment .venv and installs hora from
# this source tree into it, with the extras given as arguments (e.g. "test").
# Needs only Python 3.9+, a C++17 compiler and CMake: Open MPI comes from
# PyPI unless an MPI is already installed (an mpicc on PATH).
# The README, CI and the Docker images all install through this script.
#
# GPU builds: HORA_WITH_CUDA=1 compiles the CUDA kernels and NCCL
# collectives (nvcc needed). NCCL comes from NCCL_HOME or a system install if
# there is one; otherwise this script first installs the nvidia-nccl-cu<N>
# wheel matching nvcc's CUDA major version into the environment.
# HORA_NCCL_WHEEL=1 installs that wheel without a CUDA build (the test
# suite's compile-only check of the CUDA build uses it).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${HORA_VENV:-.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
truthy() { case "${1:-}" in 1|ON|on|On|TRUE|true|True|YES|yes) return 0;; *) return 1;; esac; }
nvcc_major() {
  local nvcc
  nvcc="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
  [ -x "$nvcc" ] || return 1
  "$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p'
}
if truthy "${HORA_WITH_CUDA:-}" || truthy "${HORA_NCCL_WHEEL:-}"; then
  if [ -z "${NCCL_HOME:-}" ] && [ ! -e /usr/include/nccl.h ] && [ ! -e /usr/local/cuda/include/nccl.h ]; then
    if major="$(nvcc_major)" && [ -n "$major" ]; then
      echo "installing NCCL for CUDA $major (nvidia-nccl-cu$major) into $venv..."
      "$venv/bin/python" -m pip install --quiet "nvidia-nccl-cu$major"
    elif truthy "${HORA_WITH_CUDA:-}"; then
      echo "HORA_WITH_CUDA=1 needs the CUDA toolkit: nvcc was not found on PATH or in /usr/local/cuda/bin" >&2
      exit 1
    fi
  fi
fi
extras=""
if [ "$#" -gt 0 ]; then
  extras="[$(IFS=,; echo "$*")]"
fi
echo "installing hora$extras into $venv (compiles the C++ core; a minute or two)..."
"$venv/bin/python" -m pip install --quiet ".$extras"
for extra in "$@"; do
  if [ "$extra" = tensorflow ]; then
    # Keras 2 (tf_keras, used with TF_USE_LEGACY_KERAS=1) for the Keras 2
    # tests. Without its dependencies: it requires the "tensorflow"
    # distribution, which would download a second, 570 MB copy of TensorFlow
    # next to tensorflow-cpu.
    "$venv/bin/python" -m pip install --quiet --no-deps "tf_keras==2.21.0"
  fi
done
"$venv/bin/python" -c "import hora; print('hora', hora.__version__, 'with', hora.build_info()['mpi_library'])"
