"""Runs tests/sharding_parallel (the sharded DistributedOptimizer) under
horarun at world sizes 1, 2, 3 and 4 (oversubscribed on a 2-core machine)."""

import pathlib

import pytest

from launch import run_horarun

pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parent


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_sharding_suite(world_size, job_env):
    env = dict(job_env, HORA_STALL_CHECK_TIME_SECONDS="30", HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    output = run_horarun(world_size, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      "-o", "faulthandler_timeout=240",
                                      str(ROOT / "sharding_parallel")], env, ROOT.parent)
    print("\n".join(line for line in output.splitlines() if " passed" in line))
