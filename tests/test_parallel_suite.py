"""Runs tests/parallel under horarun at world sizes 1, 2 and 3, and again with
the shared-memory allreduce forced at 2 and 3 ranks.

Every rank runs the same pytest session; a failure on any rank fails the
job. Ranks beyond the machine's cores are oversubscribed by horarun.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent
JOB_TIMEOUT_SECONDS = int(os.environ.get("HORA_TEST_JOB_TIMEOUT", "900"))


@pytest.mark.parametrize("world_size,algorithm", [
    (1, "auto"), (2, "auto"), (3, "auto"), (2, "shm"), (3, "shm")])
def test_parallel_suite(world_size, algorithm):
    env = dict(os.environ, HORA_ALLREDUCE_ALGORITHM=algorithm)
    command = [sys.executable, "-m", "hora.runner", "-np", str(world_size),
               sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               str(ROOT / "parallel")]
    try:
        job = subprocess.run(command, cwd=ROOT.parent, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace")
        pytest.fail(f"{world_size}-rank job hung for {JOB_TIMEOUT_SECONDS}s:\n{output[-20000:]}")
    output = job.stdout.decode(errors="replace")
    summary = [line for line in output.splitlines() if " passed" in line or " failed" in line]
    print(f"{world_size} ranks, allreduce {algorithm}:\n" + "\n".join(summary))
    assert job.returncode == 0, f"{world_size}-rank job failed:\n{output[-20000:]}"
