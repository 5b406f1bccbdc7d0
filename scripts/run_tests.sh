#!/usr/bin/env bash
# Installs hora with its test requirements (PyTorch, TensorFlow, PySpark and
# Ray) into .venv,
# and a second time with MXNet into .venv-mxnet (MXNet 1.9.1 needs
# numpy<1.24), then runs the whole suite: the style checks (ruff,
# clang-format), the C++ tests (tests/cpp, ranks as threads), single-process
# tests, the multi-rank tests under horarun at 1, 2 and 3 ranks
# (tests/parallel, tests/tf_parallel, and tests/mx_parallel in the MXNet
# environment), and the compile-only check of the CUDA build where nvcc is
# installed.
set -euo pipefail
cd "$(dirname "$0")/.."
# Where the CUDA toolkit is installed, NCCL's wheel comes along so that the
# compile-only check of the CUDA build (tests/test_cuda_build.py) can link.
HORA_NCCL_WHEEL=1 bash scripts/install.sh test torch tensorflow spark ray
HORA_VENV=.venv-mxnet bash scripts/install.sh test mxnet
export HORA_MXNET_PYTHON="$PWD/.venv-mxnet/bin/python"
export PATH="$PWD/.venv/bin:$PATH"
bash scripts/check_style.sh
bash scripts/cpp_tests.sh
exec .venv/bin/python -m pytest tests "$@"
