#!/usr/bin/env bash
# Installs hora (with PyTorch) into .venv and trains a CNN on scikit-learn's
# bundled digits on 2 local ranks with hora.torch.DistributedOptimizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh torch examples
exec .venv/bin/horarun -np "${NP:-2}" .venv/bin/python examples/pytorch/train_digits.py "$@"
