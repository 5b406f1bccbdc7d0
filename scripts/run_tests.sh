#!/usr/bin/env bash
# Installs hora with its test requirements (and PyTorch) into .venv and runs the whole
# suite: single-process tests, then tests/parallel under horarun at 1, 2
# and 3 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test torch
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest tests "$@"
