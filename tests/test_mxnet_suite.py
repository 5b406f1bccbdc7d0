"""Runs tests/mx_parallel (hora.mxnet) under horarun at world sizes 1, 2 and
3 in the MXNet environment (tests/test_docs.py trains the gluon example):
MXNet 1.9.1 needs numpy<1.24, so scripts/run_tests.sh installs hora a second
time into .venv-mxnet and points HORA_MXNET_PYTHON at its Python."""

import os
import pathlib

import pytest

from launch import run_horarun

ROOT = pathlib.Path(__file__).resolve().parent
PYTHON = os.environ.get("HORA_MXNET_PYTHON") or str(ROOT.parent / ".venv-mxnet" / "bin" / "python")

if not os.path.exists(PYTHON):
    pytest.skip(f"no MXNet environment at {PYTHON}; scripts/run_tests.sh creates it "
                f"(or set HORA_MXNET_PYTHON)", allow_module_level=True)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_mxnet_suite(world_size, job_env):
    env = dict(job_env, HORA_STALL_CHECK_TIME_SECONDS="30", HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    output = run_horarun(world_size, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      "-o", "faulthandler_timeout=240", str(ROOT / "mx_parallel")],
                         env, ROOT.parent, python=PYTHON)
    summary = [line for line in output.splitlines() if " passed" in line]
    print("\n".join(summary))
    assert summary, output[-5000:]
