"""A rank stuck outside hora while the others wait in a collective: with a
stall shutdown time set, the waiting ranks raise, exit without waiting for
the stuck one in MPI_Finalize, and horarun ends the whole job. The same for
a rank whose process is stopped (SIGSTOP) while the others wait inside a
collective with it: the heartbeat names it, and horarun blames it."""
import subprocess
import sys
import time

import pytest

SCRIPT = r"""
import time

import pytest
import numpy as np
import hora
hora.init()
if hora.rank() != 1:
    hora.allreduce(np.ones(3), name="only.some")
time.sleep(300)  # rank 1: stuck somewhere else
"""


def test_stalled_job_ends_with_the_report(tmp_path, job_env):
    script = tmp_path / "desync.py"
    script.write_text(SCRIPT)
    env = dict(job_env, HORA_STALL_CHECK_TIME_SECONDS="1", HORA_STALL_SHUTDOWN_TIME_SECONDS="2")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hora.runner", "-np", "3",
                           sys.executable, str(script)],
                          env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - began
    assert done.returncode != 0
    assert seconds < 30, f"the job took {seconds:.0f} s to end"
    assert "HoraTimeoutError" in done.stderr and "not by rank 1" in done.stderr, done.stderr


FROZEN = r"""
import os, signal, sys
import numpy as np
import hora
hora.init()
hora.allreduce(np.ones(3), name="warm-up")
if hora.rank() == int(sys.argv[1]):
    os.kill(os.getpid(), signal.SIGSTOP)  # the whole process, its threads too
hora.allreduce(np.ones(3), name="after")  # the others wait here for it
"""


@pytest.mark.parametrize("num_proc,frozen", [(2, 0), (3, 1)])
def test_a_stopped_rank_is_named_and_the_stall_shutdown_ends_the_job(tmp_path, job_env,
                                                                    num_proc, frozen):
    # The waiting ranks sit inside a collective with the stopped one, where
    # the stall inspector cannot look; the heartbeat names it instead.
    script = tmp_path / "freeze.py"
    script.write_text(FROZEN)
    env = dict(job_env, HORA_STALL_CHECK_TIME_SECONDS="1", HORA_STALL_SHUTDOWN_TIME_SECONDS="3")
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "hora.runner", "-np", str(num_proc),
                           sys.executable, str(script), str(frozen)],
                          env=env, capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - began
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert seconds < 40, f"the job took {seconds:.0f} s to end:\n{output}"
    assert f"rank {frozen} has not been heard from for 1." in output, output
    assert "HoraTimeoutError" in output and "the process is stopped" in output, output
    assert f"horarun: rank {frozen} on host" in output, output
