#!/usr/bin/env bash
# Creates (or reuses) the virtual environment .venv and installs hora from
# this source tree into it, with the extras given as arguments (e.g. "test").
# Needs only Python 3.9+, a C++17 compiler and CMake: Open MPI comes from
# PyPI unless an MPI is already installed (an mpicc on PATH).
# The README, CI and the Docker images all install through this script.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${HORA_VENV:-.venv}"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
extras=""
if [ "$#" -gt 0 ]; then
  extras="[$(IFS=,; echo "$*")]"
fi
echo "installing hora$extras into $venv (compiles the C++ core; a minute or two)..."
"$venv/bin/python" -m pip install --quiet ".$extras"
"$venv/bin/python" -c "import hora; print('hora', hora.__version__, 'with', hora.build_info()['mpi_library'])"
