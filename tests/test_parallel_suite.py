"""Runs tests/parallel under horarun at world sizes 1, 2 and 3 with the
default algorithm choice, and its reducing tests (REDUCING) again with each
allreduce path forced: the
shared-memory and ring paths at 2 and 3 ranks, MPI's own at 3, and the
hierarchical path with the ranks split into pretend hosts (3 hosts of one
rank, and 2 hosts of two ranks). Two jobs use the portable (generic) element
kernels and one the AVX2 ones instead of the CPU's widest.

Every rank runs the same pytest session; a failure on any rank fails the
job. Ranks beyond the machine's cores are oversubscribed by horarun.
"""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent
# What a forced allreduce path or kernel set changes: the reductions. The
# jobs with the default choice run every file; the others run these.
REDUCING = ["test_allreduce.py", "test_adasum.py", "test_fusion.py", "test_grouped.py",
            "test_inplace_async.py", "test_join.py", "test_process_sets.py",
            "test_reducescatter.py", "test_scaling.py", "test_shapes.py", "test_torch_buckets.py",
            "test_torch_optimizer.py", "test_torch_adasum_optimizer.py", "test_torch_ops.py"]
JOB_TIMEOUT_SECONDS = int(os.environ.get("HORA_TEST_JOB_TIMEOUT", "600"))


def cpu_has(flag):
    try:
        return flag in pathlib.Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


@pytest.mark.parametrize("world_size,algorithm,fake_hosts,kernels", [
    (1, "auto", 0, "auto"), (2, "auto", 0, "auto"), (3, "auto", 0, "auto"),
    (2, "shm", 0, "auto"), (3, "shm", 0, "generic"), (2, "ring", 0, "generic"),
    (3, "ring", 0, "avx2"), (3, "mpi", 0, "auto"),
    (3, "hierarchical", 3, "auto"), (4, "hierarchical", 2, "auto")])
def test_parallel_suite(world_size, algorithm, fake_hosts, kernels):
    # The mismatch-message and subset-init tests spell out expectations for
    # world sizes up to 3; the 4-rank job is there for the 2x2 hierarchy.
    skip = ["--ignore=" + str(ROOT / "parallel" / name)
            for name in ("test_mismatch_errors.py", "test_shutdown_reinit.py")] \
        if world_size > 3 else []
    default = (algorithm, fake_hosts, kernels) == ("auto", 0, "auto")
    files = [str(ROOT / "parallel")] if default else \
        [str(ROOT / "parallel" / name) for name in REDUCING]
    if kernels == "avx2" and not (cpu_has("avx2") and cpu_has("f16c") and cpu_has("fma")):
        kernels = "generic"  # the instruction set is not there to test
    # A test that fails on some ranks only leaves the others waiting in a
    # collective: the stall inspector then ends the job with a report naming
    # the tensor and the ranks, instead of a silent wait for the job timeout.
    env = dict(os.environ, HORA_ALLREDUCE_ALGORITHM=algorithm,
               HORA_TEST_FAKE_HOSTS=str(fake_hosts), HORA_CPU_KERNELS=kernels,
               HORA_STALL_CHECK_TIME_SECONDS="30", HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    command = [sys.executable, "-m", "hora.runner", "-np", str(world_size),
               sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               # A test stuck for minutes prints every thread's Python stack.
               "-o", "faulthandler_timeout=240", *skip, *files]
    try:
        job = subprocess.run(command, cwd=ROOT.parent, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as error:
        output = (error.stdout or b"").decode(errors="replace")
        pytest.fail(f"{world_size}-rank job hung for {JOB_TIMEOUT_SECONDS}s:\n{output[-20000:]}")
    output = job.stdout.decode(errors="replace")
    summary = [line for line in output.splitlines() if " passed" in line or " failed" in line]
    print(f"{world_size} ranks, allreduce {algorithm}, {fake_hosts or 1} host(s), "
          f"kernels {kernels}:\n" + "\n".join(summary))
    assert job.returncode == 0, f"{world_size}-rank job failed:\n{output[-20000:]}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_exact_reduce_gradients(world_size):
    """The gradients of Min, Max and Product with
    HORA_EXACT_REDUCE_GRADIENTS=1 (the default jobs check Horovod's)."""
    env = dict(os.environ, HORA_EXACT_REDUCE_GRADIENTS="1",
               HORA_STALL_CHECK_TIME_SECONDS="30", HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    command = [sys.executable, "-m", "hora.runner", "-np", str(world_size),
               sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "-o", "faulthandler_timeout=240", str(ROOT / "parallel" / "test_torch_autograd.py")]
    job = subprocess.run(command, cwd=ROOT.parent, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_SECONDS)
    output = job.stdout.decode(errors="replace")
    print("\n".join(line for line in output.splitlines() if " passed" in line))
    assert job.returncode == 0, output[-20000:]
    assert " skipped" not in output, output[-5000:]  # the ties test ran
