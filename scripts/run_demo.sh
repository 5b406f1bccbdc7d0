#!/usr/bin/env bash
# Installs hora into .venv and trains the example network on 2 local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
exec .venv/bin/horarun -np "${NP:-2}" .venv/bin/python examples/numpy/train_mlp.py "$@"
