"""A rank stuck outside hora while the others wait in a collective: with a
stall shutdown time set, the waiting ranks raise, exit without waiting for
the stuck one in MPI_Finalize, and horarun ends the whole job."""
import subprocess
import sys
import time

SCRIPT = r"""
import time
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
