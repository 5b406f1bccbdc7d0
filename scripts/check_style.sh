#!/usr/bin/env bash
# The style checks the test command runs: ruff on the Python code,
# clang-format (the versions pinned in the "test" extra) on the C++ code,
# no import cycles among hora's Python modules, mypy over python/hora
# (pyproject.toml's [tool.mypy]), and python/hora/_C.pyi against the built
# hora._C (scripts/check_stubs.py: mypy's stubtest).
# Fix what they report with `ruff check --fix` and `clang-format -i FILE`.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${HORA_STYLE_BIN:-.venv/bin}"
"$bin/ruff" check python tests scripts examples
mapfile -t cpp < <(git ls-files --cached --others --exclude-standard \
  'csrc/*.cc' 'csrc/*.h' 'csrc/*.cu' 'tests/cpp/*.cc' 'tests/cpp/*.h')
"$bin/clang-format" --dry-run --Werror --style=file "${cpp[@]}"
echo "style: ruff and clang-format found nothing (${#cpp[@]} C++ files)"
"$bin/python" scripts/check_import_cycles.py
"$bin/mypy"
"$bin/python" scripts/check_stubs.py
