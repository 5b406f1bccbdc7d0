"""What the Spark and Ray tests check after a job: that none of its MPI
daemons or ranks is still running."""
import os
import time

_MARKS = (b"hora.cluster.rank_main", b"prted")


def living_job_processes():
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and any(mark in cmdline for mark in _MARKS):
            found.append((int(entry), cmdline.replace(b"\0", b" ")[:120].decode()))
    return found


def assert_no_job_processes(within_s=15.0):
    """Daemons whose task was killed leave when mpirun goes, a few seconds
    later; anything alive after ``within_s`` was left behind."""
    deadline = time.monotonic() + within_s
    while True:
        left = living_job_processes()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    assert not left, f"processes of the job left behind: {left}"


def ancestors_cmdlines():
    """The command lines of this process's ancestors, nearest first."""
    out, pid = [], os.getpid()
    while pid > 1:
        with open(f"/proc/{pid}/stat", "rb") as f:
            pid = int(f.read().rsplit(b")", 1)[1].split()[1])
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            out.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
    return out
