"""Runs tests/tf_parallel (hora.tensorflow and hora.keras) under horarun at
world sizes 1, 2 and 3. The examples are trained by tests/test_docs.py, from
the getting-started pages that walk through them."""

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("tensorflow")

ROOT = pathlib.Path(__file__).resolve().parent
TIMEOUT_SECONDS = 600


def run_job(world_size, args, env, cwd):
    command = [sys.executable, "-m", "hora.runner", "-np", str(world_size), sys.executable, *args]
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
def test_tensorflow_suite(world_size, job_env):
    env = dict(job_env, HORA_STALL_CHECK_TIME_SECONDS="30", HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    output = run_job(world_size, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "-o", "faulthandler_timeout=240", str(ROOT / "tf_parallel")],
                     env, ROOT.parent)
    print("\n".join(line for line in output.splitlines() if " passed" in line))
