"""Real horarun jobs on this machine, using the installed hora and its mpirun."""
import os
import subprocess
import sys

import pytest

from hora.runner import mpi_command

# A hung job must fail the test rather than the whole run.
TIMEOUT_S = 120

try:
    MPIRUN = mpi_command.find_mpirun()
    FLAVOUR = mpi_command.query_flavour(MPIRUN)
except mpi_command.MpiError as exc:
    pytest.skip(f"no usable mpirun: {exc}", allow_module_level=True)


def horarun(num_proc, script, extra_env=None):
    # Drop the rank variables of any job this test itself runs in, so the
    # inner mpirun starts a fresh job instead of joining the outer one.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "hora.runner", "-np", str(num_proc), sys.executable, "-c", script],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("num_proc", [1, 2, 3])
def test_every_rank_reports_its_place(num_proc):
    script = (
        "import os\n"
        "print('rank=%s size=%s local=%s token=%s' % (os.environ['HORA_RANK'], os.environ['HORA_SIZE'],\n"
        "      os.environ['HOROVOD_LOCAL_RANK'], os.environ.get('HORA_TEST_TOKEN')))\n"
    )
    done = horarun(num_proc, script, {"HORA_TEST_TOKEN": "t0k"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for rank in range(num_proc):
        assert f"[{rank}] rank={rank} size={num_proc} local={rank} token=t0k" in lines, done.stdout
    assert len(lines) == num_proc, done.stdout


def test_stderr_and_partial_lines_are_prefixed():
    script = "import os, sys\nsys.stderr.write('no newline from ' + os.environ['HORA_RANK'])\n"
    done = horarun(2, script)
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"[{rank}] no newline from {rank}" in done.stderr.splitlines()


def test_failing_rank_fails_the_job():
    script = "import os, sys\nsys.exit(3 if os.environ['HORA_RANK'] == '1' else 0)\n"
    done = horarun(2, script)
    assert done.returncode != 0
    if FLAVOUR == mpi_command.OPEN_MPI:
        assert done.returncode == 3
    assert f"horarun: job failed with exit code {done.returncode}" in done.stderr


def test_rank_killed_by_signal_is_reported():
    script = "import os, signal\nif os.environ['HORA_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
    done = horarun(2, script)
    assert done.returncode != 0
    assert "[1] killed by signal SIGKILL" in done.stderr
