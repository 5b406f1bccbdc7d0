#!/usr/bin/env bash
# Installs hora with its test requirements (PyTorch, TensorFlow) into .venv,
# and a second time with MXNet into .venv-mxnet (MXNet 1.9.1 needs
# numpy<1.24), then runs the whole suite: single-process tests, then the
# multi-rank tests under horarun at 1, 2 and 3 ranks (tests/parallel,
# tests/tf_parallel, and tests/mx_parallel in the MXNet environment).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test torch tensorflow
HORA_VENV=.venv-mxnet bash scripts/install.sh test mxnet
export HORA_MXNET_PYTHON="$PWD/.venv-mxnet/bin/python"
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest tests "$@"
