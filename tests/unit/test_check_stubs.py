"""scripts/check_stubs.py, the style step's check of python/hora/_C.pyi
against the built hora._C: it reads pybind11's signatures, and it fails when
the stub drifts from the module (the passing run is the style step's)."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy.stubtest")

ROOT = Path(__file__).resolve().parents[2]


def load_check():
    path = ROOT / "scripts" / "check_stubs.py"
    spec = importlib.util.spec_from_file_location("check_stubs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reads_the_signatures_pybind11_writes_into_docstrings():
    from hora import _C

    check = load_check()
    assert str(check.pybind11_signature(_C.init)) == \
        "(comm_handle=None, ranks=None, dynamic_process_sets=False)"
    assert str(check.pybind11_signature(_C.start_timeline)) == "(path, mark_cycles=False)"
    # unnamed parameters (arg0) cannot be passed by keyword
    assert str(check.pybind11_signature(_C.remove_process_set)) == "(arg0, /)"
    assert str(check.pybind11_signature(_C.Work.wait_for)) == "(self, arg0, /)"
    assert check.pybind11_signature(len) is None  # not a pybind11 function
    assert check.unreadable == []


def test_fails_when_the_stub_drifts(tmp_path):
    # a copy of the package whose stub lacks a function and a parameter,
    # found before the work tree's (MYPYPATH comes before mypy_path)
    shutil.copytree(ROOT / "python" / "hora", tmp_path / "hora",
                    ignore=shutil.ignore_patterns("__pycache__"))
    stub = tmp_path / "hora" / "_C.pyi"
    text = stub.read_text()
    drifted = text.replace("def add_process_set(", "def _gone(").replace(
        "    dynamic_process_sets: bool = False,\n", "")
    assert drifted.count("\n") == text.count("\n") - 1
    stub.write_text(drifted)
    env = dict(os.environ, MYPYPATH=str(tmp_path))
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_stubs.py")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "hora._C.add_process_set is not present in stub" in run.stdout
    assert 'hora._C.init is inconsistent, stub does not have parameter "dynamic_process_sets"' \
        in run.stdout
