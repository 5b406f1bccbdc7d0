#!/usr/bin/env bash
# Installs hora with its test requirements (PyTorch, TensorFlow, PySpark and
# Ray) into .venv,
# and a second time with MXNet into .venv-mxnet (MXNet 1.9.1 needs
# numpy<1.24), then runs the whole suite: the style checks (ruff,
# clang-format), the C++ tests (tests/cpp, ranks as threads), single-process
# tests, the multi-rank tests under horarun at 1, 2 and 3 ranks
# (tests/parallel, tests/tf_parallel, and tests/mx_parallel in the MXNet
# environment), and the compile-only check of the CUDA build where nvcc is
# installed. The container tests (tests/test_containers.py) need podman: run
# as root on a machine with apt and without podman, this script installs it
# (with runc and mmdebstrap) first; elsewhere those tests are skipped. They
# run beside the others.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v podman >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing podman, runc and mmdebstrap for the container tests..."
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
           podman runc mmdebstrap uidmap >/dev/null; }; then
    echo "could not install podman; the container tests will be skipped" >&2
  fi
fi
# Where the CUDA toolkit is installed, NCCL's wheel comes along so that the
# compile-only check of the CUDA build (tests/test_cuda_build.py) can link.
HORA_NCCL_WHEEL=1 bash scripts/install.sh test torch tensorflow spark ray
HORA_VENV=.venv-mxnet bash scripts/install.sh test mxnet
export HORA_MXNET_PYTHON="$PWD/.venv-mxnet/bin/python"
export PATH="$PWD/.venv/bin:$PATH"
bash scripts/check_style.sh
bash scripts/cpp_tests.sh
# The container tests spend much of their time waiting on image builds
# (unpacking packages, writing layers), so they run beside the rest, their
# report printed after it. The slowest tests are listed at the end of each,
# to watch the suite's time.
mkdir -p build
containers_log=build/container-tests.log
.venv/bin/python -m pytest tests/test_containers.py --durations=10 "$@" >"$containers_log" 2>&1 &
containers=$!
status=0
.venv/bin/python -m pytest tests --ignore=tests/test_containers.py --durations=25 "$@" || status=$?
containers_status=0
wait "$containers" || containers_status=$?
echo "===== tests/test_containers.py (ran beside the others) ====="
cat "$containers_log"
# 5: no test matched the arguments in that file (-k ...), which is no failure.
if [ "$containers_status" != 0 ] && [ "$containers_status" != 5 ]; then
  [ "$status" != 0 ] || status=$containers_status
fi
exit "$status"
