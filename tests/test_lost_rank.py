"""A rank whose process vanishes between collectives: every surviving rank's
error names it (rank 0 sees the connection close and tells the others),
instead of the survivors naming rank 0 or hanging. (A rank lost in the middle
of a collective leaves its peers inside MPI; there the launcher stops the job
and horarun names the rank, see tests/unit/test_runner_localhost.py.)"""
import subprocess
import sys

import pytest

SCRIPT = r"""
import os, sys, time
import numpy as np
import hora

out = sys.argv[1]
hora.init()
rank = hora.rank()
hora.allreduce(np.ones(4), name="warm-up")
if rank == 1:
    time.sleep(0.2)
    os._exit(0)
time.sleep(1.0)  # the engines are idle when rank 1 goes
began = time.monotonic()
try:
    hora.allreduce(np.ones(4), name="after")
    text = "no error"
except hora.HoraError as error:
    text = f"{type(error).__name__}: {error} after {time.monotonic() - began:.1f} s"
with open(os.path.join(out, f"rank.{rank}"), "w") as f:
    f.write(text)
os._exit(0)
"""


@pytest.mark.parametrize("num_proc", [2, 3])
def test_survivors_name_the_lost_rank(tmp_path, num_proc, job_env):
    script = tmp_path / "lose_rank_1.py"
    script.write_text(SCRIPT)
    # Open MPI would stop the job as soon as rank 1 vanished; with recovery
    # on, the survivors run on and report what hora told them.
    done = subprocess.run([sys.executable, "-m", "hora.runner", "-np", str(num_proc),
                           "--mpi-args", "--enable-recovery",
                           sys.executable, str(script), str(tmp_path)],
                          env=job_env, capture_output=True, text=True, timeout=120)
    for rank in [r for r in range(num_proc) if r != 1]:
        path = tmp_path / f"rank.{rank}"
        assert path.exists(), f"rank {rank} recorded nothing:\n{done.stdout}\n{done.stderr}"
        text = path.read_text()
        assert text.startswith("HoraInternalError"), text
        assert "rank 1" in text and "connection to rank 0" not in text, text
