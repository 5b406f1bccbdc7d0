"""horarun runs the command the user's shell would run: the ranks get the
caller's PATH back even when mpirun puts its own bin directory first (Open
MPI's does, run by its full path), and horarun's virtual environment leads
it when that environment is not on PATH. Real jobs, with the PyPI Open MPI
in the environment and with Debian's system Open MPI."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from hora.runner import cli, mpi_command

TIMEOUT_S = 120
SYSTEM_MPIRUN = "/usr/bin/mpirun"


def clean_env(path):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_COMM_WORLD_", "PMIX_", "PMI_", "VIRTUAL_ENV"))}
    env["PATH"] = path
    return env


@pytest.fixture
def shim(tmp_path):
    """A directory whose ``python`` says it ran, and the PATH it leads."""
    directory = tmp_path / "shim"
    directory.mkdir()
    for name in ("python", "python3"):
        script = directory / name
        script.write_text("#!/bin/sh\necho \"shim python rank=$HORA_RANK\"\n")
        script.chmod(0o755)
    venv_bin = os.path.dirname(sys.executable)
    return str(directory), os.pathsep.join([str(directory), venv_bin, "/usr/bin", "/bin"])


def run_horarun(args, path, bin_dir=None, tmp_path=None):
    """horarun, with the mpirun of ``bin_dir`` when given (what a build
    against that MPI finds beside its mpicc)."""
    if bin_dir is None:
        launcher = [sys.executable, "-m", "hora.runner"]
    else:
        wrapper = tmp_path / "horarun_system_mpi.py"
        wrapper.write_text(textwrap.dedent(f"""\
            import sys
            from hora.runner import cli
            cli.built_mpi_bin_dir = lambda: {bin_dir!r}
            sys.exit(cli.main(sys.argv[1:]))
            """))
        launcher = [sys.executable, str(wrapper)]
    return subprocess.run([*launcher, *args], env=clean_env(path), capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def test_rank_path_leaves_a_path_with_the_environment_alone():
    env = {"PATH": os.pathsep.join(["/opt/venv/bin", "/usr/bin"])}
    assert cli.rank_path(env, ["python"], prefix="/opt/venv", base_prefix="/usr") is None
    assert env["PATH"] == env["HORA_RANK_PATH"] == "/opt/venv/bin:/usr/bin"
    assert "VIRTUAL_ENV" not in env


def test_rank_path_puts_horaruns_environment_first_and_says_so():
    env = {"PATH": "/usr/bin:/bin"}
    found = {"/usr/bin:/bin": "/usr/bin/python", "/opt/venv/bin:/usr/bin:/bin":
             "/opt/venv/bin/python"}
    note = cli.rank_path(env, ["python", "train.py"], prefix="/opt/venv", base_prefix="/usr",
                         which=lambda name, path: found[path])
    assert env["HORA_RANK_PATH"] == env["PATH"] == "/opt/venv/bin:/usr/bin:/bin"
    assert env["VIRTUAL_ENV"] == "/opt/venv"
    assert note == ("horarun: 'python' runs as /opt/venv/bin/python on the ranks: horarun's "
                    "virtual environment (/opt/venv) leads their PATH, not /usr/bin/python")
    # A command given by its path says nothing; outside an environment, nothing changes.
    assert cli.rank_path({"PATH": "/usr/bin"}, ["./train.sh"], prefix="/opt/venv",
                         base_prefix="/usr") is None
    plain = {"PATH": "/usr/bin"}
    assert cli.rank_path(plain, ["python"], prefix="/usr", base_prefix="/usr") is None
    assert plain["PATH"] == "/usr/bin"


def test_the_ranks_run_the_shells_python(shim, tmp_path):
    _, path = shim
    done = run_horarun(["-np", "2", "python3", "-c", "pass"], path)
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"[{rank}] shim python rank={rank}" in done.stdout


def test_an_environment_off_path_runs_its_own_python(tmp_path):
    if sys.prefix == sys.base_prefix:
        pytest.skip("the suite does not run from a virtual environment")
    done = run_horarun(["-np", "2", "python", "-c", "import sys; print(sys.prefix)"],
                       "/usr/bin:/bin")
    assert done.returncode == 0, done.stderr
    for rank in range(2):
        assert f"[{rank}] {sys.prefix}" in done.stdout
    assert f"horarun's virtual environment ({sys.prefix}) leads their PATH" in done.stderr


def system_open_mpi():
    """Debian's Open MPI, installed here if it is not (root and apt-get),
    or the reason it cannot be had."""
    if not os.path.exists(SYSTEM_MPIRUN):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            return "Debian's openmpi-bin is not installed, and this is not root with apt-get"
        install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "openmpi-bin"]
        done = subprocess.run(install, capture_output=True, text=True, timeout=600,
                              env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))
        if done.returncode != 0:
            return f"apt-get could not install openmpi-bin: {done.stderr.strip()[-300:]}"
    try:
        version = mpi_command.query_version_text(SYSTEM_MPIRUN)
    except mpi_command.MpiError as exc:
        return f"{SYSTEM_MPIRUN} does not run: {exc}"
    if "Open MPI" not in version and "OpenRTE" not in version:
        return f"{SYSTEM_MPIRUN} is not Open MPI: {version.splitlines()[0]}"
    return None


def test_a_system_open_mpi_does_not_change_which_python_runs(shim, tmp_path):
    reason = system_open_mpi()
    if reason:
        pytest.skip(reason)
    _, path = shim
    # Without horarun, Open MPI's mpirun (run by its full path) puts
    # /usr/bin first on the ranks' PATH: the command is not the shell's.
    bare = subprocess.run([SYSTEM_MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "1",
                           "sh", "-c", "command -v python3"],
                          env=clean_env(path), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert bare.stdout.strip() == "/usr/bin/python3", bare.stdout + bare.stderr
    done = run_horarun(["-np", "2", "python3", "-c", "pass"], path, bin_dir="/usr/bin",
                       tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(2):
        assert f"[{rank}] shim python rank={rank}" in done.stdout
