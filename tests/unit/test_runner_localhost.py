"""Real horarun jobs on this machine, using the installed hora and its mpirun."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from hora.runner import mpi_command

# A hung job must fail the test rather than the whole run.
TIMEOUT_S = 120

try:
    MPIRUN = mpi_command.find_mpirun()
    FLAVOUR = mpi_command.query_flavour(MPIRUN)
except mpi_command.MpiError as exc:
    pytest.skip(f"no usable mpirun: {exc}", allow_module_level=True)


def horarun(num_proc, script, extra_env=None, options=()):
    # Drop the rank variables of any job this test itself runs in, so the
    # inner mpirun starts a fresh job instead of joining the outer one.
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "hora.runner", "-np", str(num_proc), *options, sys.executable, "-c",
         script],
        env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize("num_proc", [1, 2, 3])
def test_every_rank_reports_its_place(num_proc):
    script = (
        "import os\n"
        "print('rank=%s size=%s local=%s token=%s' % (os.environ['HORA_RANK'],\n"
        "      os.environ['HORA_SIZE'], os.environ['HOROVOD_LOCAL_RANK'],\n"
        "      os.environ.get('HORA_TEST_TOKEN')))\n"
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
    assert "horarun: rank 1 on host " in done.stderr
    assert "failed first (exit code 3)" in done.stderr


def test_the_rank_that_raised_is_blamed_though_its_peer_exits_first():
    # Rank 1 raises; on its way out hora shuts down (rank 0 then fails with
    # HoraShutdownError and exits), and rank 1 lingers 3 s in an exit
    # handler that runs after hora's: rank 0 exits first, rank 1 caused it.
    script = textwrap.dedent("""\
        import atexit, os, time
        if os.environ["HORA_RANK"] == "1":
            atexit.register(time.sleep, 3)
        import numpy as np
        import hora
        hora.init()
        for step in range(1000):
            hora.allreduce(np.ones(2), name=f"blame.{step}")
            if hora.rank() == 1 and step == 2:
                raise ValueError("rank 1 broke")
        """)
    done = horarun(2, script)
    assert done.returncode == 1, done.stderr
    assert "ValueError: rank 1 broke" in done.stderr
    assert "HoraShutdownError" in done.stderr
    assert "horarun: rank 1 on host " in done.stderr and "failed first (exit code 1)" in done.stderr


def test_a_background_process_does_not_hold_the_job_open():
    # The rank starts a process that outlives it with the rank's output
    # inherited; the job ends with the rank, not with the process.
    marker = "31.739"
    script = (f"import subprocess\nsubprocess.Popen(['sleep', '{marker}'])\n"
              "print('started it', flush=True)\n")
    began = time.monotonic()
    try:
        done = horarun(1, script)
        took = time.monotonic() - began
    finally:
        subprocess.run(["pkill", "-f", f"sleep {marker}"], check=False)
    assert done.returncode == 0, done.stderr
    assert "[0] started it" in done.stdout
    assert took < 20, f"horarun waited {took:.1f} s for the background process"


def test_rank_killed_by_signal_is_reported():
    script = ("import os, signal\n"
              "if os.environ['HORA_RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n")
    done = horarun(2, script)
    assert done.returncode != 0
    assert "[1] killed by signal SIGKILL" in done.stderr


def _hora_processes(token):
    """PIDs of live processes whose command line holds ``token``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("num_proc", [2, 3])
def test_rank_killed_mid_collective_stops_the_job(num_proc):
    # The last rank dies by SIGKILL while every rank is inside a stream of
    # allreduces; the survivors must be stopped, not left waiting for it.
    token = f"hora-kill-test-{os.getpid()}-{num_proc}"
    script = (
        f"# {token}\n"
        "import os, signal, numpy as np, hora\n"
        "hora.init()\n"
        "for step in range(1000000):\n"
        "    hora.allreduce(np.ones(1000, np.float32), name='grad')\n"
        "    if step == 50 and hora.rank() == hora.size() - 1:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    began = time.monotonic()
    done = horarun(num_proc, script)
    seconds = time.monotonic() - began
    assert done.returncode == 128 + signal.SIGKILL, done.stderr
    assert f"horarun: rank {num_proc - 1} on host " in done.stderr
    assert "failed first (killed by SIGKILL)" in done.stderr
    # 5 s: start-up of Python ranks
    assert seconds < 10 + 5, f"the job took {seconds:.1f} s to stop"
    time.sleep(0.5)
    assert _hora_processes(token) == [], "ranks outlived the job"


def test_sigint_to_horarun_stops_every_rank():
    token = f"hora-sigint-test-{os.getpid()}"
    script = f"# {token}\nimport time\nprint('up', flush=True)\ntime.sleep(300)\n"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    job = subprocess.Popen([sys.executable, "-m", "hora.runner", "-np", "2", sys.executable, "-c",
                            script],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = 0
        while seen < 2:
            line = job.stdout.readline()
            assert line, "the job ended before its ranks started"
            seen += line.endswith("up\n")
        job.send_signal(signal.SIGINT)
        _, err = job.communicate(timeout=20)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 128 + signal.SIGINT
    assert "job stopped by SIGINT" in err
    time.sleep(0.5)
    assert _hora_processes(token) == []


def test_output_filename_writes_one_directory_per_rank(tmp_path):
    script = "import os, sys\nprint('out', os.environ['HORA_RANK'])\nsys.stderr.write('err\\n')\n"
    done = horarun(3, script, options=["--output-filename", str(tmp_path / "logs")])
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert sorted(os.listdir(tmp_path / "logs")) == ["rank.0", "rank.1", "rank.2"]
    for rank in range(3):
        assert (tmp_path / "logs" / f"rank.{rank}" / "stdout").read_text() == f"out {rank}\n"
        assert (tmp_path / "logs" / f"rank.{rank}" / "stderr").read_text() == "err\n"
    assert f"{tmp_path / 'logs'}/rank.<N>" in done.stderr


def test_variables_reach_every_rank():
    script = ("import os\nprint(os.environ.get('HORA_CYCLE_TIME_MS'), os.environ.get('MY_FLAG'),"
              " os.environ.get('MY_VALUE'), os.environ.get('HORA_LOG_LEVEL'))\n")
    done = horarun(2, script, extra_env={"MY_FLAG": "yes", "HORA_LOG_LEVEL": "error"},
                   options=["--cycle-time-ms", "3", "-x", "MY_FLAG", "-x", "MY_VALUE=7"])
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"[{rank}] 3 yes 7 error" in done.stdout.splitlines(), done.stdout


def test_ranks_are_bound_to_their_share_of_the_cores():
    cores = mpi_command.usable_cores()
    if FLAVOUR != mpi_command.OPEN_MPI:
        pytest.skip("binding is checked with Open MPI's mapping")
    script = "import os\nprint(len(os.sched_getaffinity(0)))\n"
    done = horarun(1, script)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"[0] {cores}"
    if cores >= 2:
        done = horarun(2, script)
        assert sorted(done.stdout.split()) == sorted(["[0]", "[1]", str(cores // 2),
                                                      str(cores // 2)])
    done = horarun(cores + 1, script)
    assert all(line.endswith(f" {cores}") for line in done.stdout.splitlines()), done.stdout


def test_ranks_get_a_thread_count_unless_set():
    script = "import os\nprint(os.environ.get('OMP_NUM_THREADS'))\n"
    env = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"
           and not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_"))}
    done = subprocess.run([sys.executable, "-m", "hora.runner", "-np", "2", sys.executable, "-c",
                           script], env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    share = max(1, mpi_command.usable_cores() // 2)
    expected = sorted(["[0]", "[1]", str(share), str(share)])
    assert sorted(done.stdout.split()) == expected, done.stdout
    done = horarun(2, script, extra_env={"OMP_NUM_THREADS": "3"})
    assert sorted(done.stdout.split()) == sorted(["[0]", "[1]", "3", "3"]), done.stdout


def test_verbose_prints_the_mpirun_command():
    done = horarun(1, "pass", options=["--verbose"])
    assert done.returncode == 0
    first = done.stderr.splitlines()[0]
    assert "mpirun" in first and "hora.runner.rank_exec" in first
