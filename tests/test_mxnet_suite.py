"""Runs tests/mx_parallel (hora.mxnet) under horarun at world sizes 1, 2 and
3 in the MXNet environment (tests/test_docs.py trains the gluon example):
MXNet 1.9.1 needs numpy<1.24, so scripts/run_tests.sh installs hora a second
time into .venv-mxnet and points HORA_MXNET_PYTHON at its Python."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent
TIMEOUT_SECONDS = 600
PYTHON = os.environ.get("HORA_MXNET_PYTHON") or str(ROOT.parent / ".venv-mxnet" / "bin" / "python")

if not os.path.exists(PYTHON):
    pytest.skip(f"no MXNet environment at {PYTHON}; scripts/run_tests.sh creates it "
                f"(or set HORA_MXNET_PYTHON)", allow_module_level=True)


def run_job(world_size, args, env, cwd):
    env = dict(env, PATH=os.path.dirname(PYTHON) + os.pathsep + env.get("PATH", ""))
    command = [PYTHON, "-m", "hora.runner", "-np", str(world_size), PYTHON, *args]
    try:
        job = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace")
        pytest.fail(f"{world_size}-rank job hung for {TIMEOUT_SECONDS}s:\n{output[-20000:]}")
    output = job.stdout.decode(errors="replace")
    assert job.returncode == 0, f"{world_size}-rank job failed:\n{output[-20000:]}"
    return output


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_mxnet_suite(world_size, job_env):
    env = dict(job_env, HORA_STALL_CHECK_TIME_SECONDS="30", HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    output = run_job(world_size, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "-o", "faulthandler_timeout=240", str(ROOT / "mx_parallel")],
                     env, ROOT.parent)
    summary = [line for line in output.splitlines() if " passed" in line]
    print("\n".join(summary))
    assert summary, output[-5000:]
