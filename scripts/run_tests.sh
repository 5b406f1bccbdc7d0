#!/usr/bin/env bash
# Installs hora with its test requirements (PyTorch, TensorFlow) into .venv and runs the whole
# suite: single-process tests, then tests/parallel under horarun at 1, 2
# and 3 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test torch tensorflow
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest tests "$@"
