"""horarun killed outright (SIGKILL, so it cannot clean up): mpirun, which
it started, gets SIGTERM from the kernel and takes the ranks down with it,
instead of the job training on unwatched (an elastic job would then delete
its commit at its end)."""
import os
import signal
import subprocess
import sys
import time

import pytest

SCRIPT = r"""
import os, sys, time
import hora
hora.init()
with open(os.path.join(sys.argv[1], f"pid.{hora.rank()}"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has ended; only its parent has not reaped it yet
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", [["-np", "2"], ["-np", "2", "--min-np", "1"]],
                         ids=["fixed", "elastic"])
def test_the_ranks_end_with_a_killed_horarun(tmp_path, job_env, mode):
    script = tmp_path / "sleeper.py"
    script.write_text(SCRIPT)
    launcher = subprocess.Popen([sys.executable, "-m", "hora.runner", *mode, sys.executable,
                                 str(script), str(tmp_path)], env=job_env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and len(list(tmp_path.glob("pid.*"))) < 2:
            assert launcher.poll() is None, "horarun ended early"
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
        assert len(pids) == 2, "the ranks did not start"
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(alive(pid) for pid in pids):
            time.sleep(0.2)
        assert not any(alive(pid) for pid in pids), "ranks still run after horarun was killed"
    finally:
        launcher.kill()
        for pid_file in tmp_path.glob("pid.*"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
