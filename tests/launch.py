"""Starting a job under horarun from a test: one helper for the suites that
run a directory of multi-rank tests, and for the documentation's examples."""

import os
import subprocess
import sys

import pytest

TIMEOUT_SECONDS = 600


def run_horarun(world_size, args, env, cwd, python=sys.executable, timeout=TIMEOUT_SECONDS):
    """Runs ``python args...`` as ``world_size`` ranks under ``python``'s
    horarun (its environment's ``mpirun`` first on PATH) and returns the
    job's output; fails the test when the job hangs or fails."""
    env = dict(env, PATH=os.path.dirname(python) + os.pathsep + env.get("PATH", ""))
    command = [python, "-m", "hora.runner", "-np", str(world_size), python, *args]
    try:
        job = subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace")
        pytest.fail(f"{world_size}-rank job hung for {timeout}s:\n{output[-20000:]}")
    output = job.stdout.decode(errors="replace")
    assert job.returncode == 0, f"{world_size}-rank job failed:\n{output[-20000:]}"
    return output
