"""Launching and watching the MPI job that runs inside the engine's tasks."""
import collections
import io
import os
import shlex
import subprocess
import sys
import tempfile
import threading

from hora.cluster import channel, processes

# How many of the job's last output lines an error message quotes.
TAIL_LINES = 30


class JobError(RuntimeError):
    """A hora job in Spark or Ray failed: a rank raised, a task or actor was
    lost, or the tasks did not all start. ``rank``, ``host``, ``error_type``
    and ``remote_traceback`` say where and what, when that is known."""

    def __init__(self, message, rank=None, host=None, error_type=None, remote_traceback=None):
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.error_type = error_type
        self.remote_traceback = remote_traceback


# Exceptions a rank raises because another rank failed first (the job shut
# down under it); the first rank's own error is the one to report.
CONSEQUENCE_TYPES = ("HoraShutdownError", "HoraInternalError")


def root_cause_order(error_type, failed_at, rank):
    """Sort key putting the failure that started it all first."""
    return (error_type.rsplit(".", 1)[-1] in CONSEQUENCE_TYPES, failed_at, rank)


def rank_failure(prefix, result):
    """The JobError for a rank that reported an exception."""
    last = result.payload.rstrip().splitlines()[-1] if result.payload else result.error_type
    return JobError(f"{prefix}: rank {result.rank} (host {result.hostname}) raised {last}\n"
                    f"--- traceback on rank {result.rank} ---\n{result.payload}",
                    rank=result.rank, host=result.hostname, error_type=result.error_type,
                    remote_traceback=result.payload)


def _agent_options(agent):
    """mpirun options that make it start its daemons through ``agent``."""
    from hora.runner.mpi_command import (
        OPEN_MPI, MpiError, built_mpi_bin_dir, detect_flavour, describe_version, find_mpirun,
        pypi_mpirun, query_version_text)
    try:
        mpirun = find_mpirun(system_bin_dir=built_mpi_bin_dir(), wheel_mpirun=pypi_mpirun())
        text = query_version_text(mpirun)
        flavour = detect_flavour(text)
    except MpiError as exc:
        raise JobError(str(exc)) from None
    if flavour != OPEN_MPI:
        raise JobError(f"hora.spark and hora.ray start their ranks through Open MPI's launcher; "
                       f"hora was built with {describe_version(text)}")
    if describe_version(text).startswith("Open MPI 4"):
        return ["--mca", "plm_rsh_agent", agent], "--mca"
    return ["--prtemca", "plm_ssh_agent", agent], "--prtemca"


def _write_agent(directory):
    path = os.path.join(directory, "hora-ssh-agent")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m hora.cluster.ssh_agent \"$@\"\n")
    os.chmod(path, 0o755)
    return path


class MpiJob:
    """``horarun`` over the task hosts, with the given rank program."""

    def __init__(self, driver, groups, mode, *, env=None, extra_mpi_args=None, nics=None,
                 stdout=None, stderr=None, verbose=1, start_timeout=60.0, log=print,
                 prefix_output_with_timestamp=False, executable=None):
        self._scratch = tempfile.TemporaryDirectory(prefix="hora-cluster-")
        agent = _write_agent(self._scratch.name)
        mpi_args, launcher_option = _agent_options(agent)
        if nics:
            nics = ",".join(nics) if not isinstance(nics, str) else nics
            mpi_args += ["--mca", "btl_tcp_if_include", nics,
                         launcher_option, "oob_tcp_if_include", nics]
        if extra_mpi_args:
            mpi_args += (shlex.split(extra_mpi_args) if isinstance(extra_mpi_args, str)
                         else list(extra_mpi_args))
        num_proc = sum(len(group.tasks) for group in groups)
        host_string = ",".join(f"{group.alias}:{len(group.tasks)}" for group in groups)
        # the ranks are started by daemons inside the tasks: what they must
        # see of the driver's environment is passed by name (-x)
        forwarded = [arg for name in sorted(env or {}) for arg in ("-x", str(name))]
        self.command = [sys.executable, "-m", "hora.runner", "-np", str(num_proc),
                        "-H", host_string, "--binding-args", "--bind-to none", *forwarded,
                        "--mpi-args", shlex.join(mpi_args),
                        "--start-timeout", f"{start_timeout:g}",
                        *(["--prefix-output-with-timestamp"] if prefix_output_with_timestamp
                          else []),
                        "--", executable or sys.executable, "-m", "hora.cluster.rank_main",
                        mode]
        job_env = dict(os.environ)
        job_env.update({str(k): str(v) for k, v in (env or {}).items()})
        job_env[channel.DRIVER_ENV] = channel.format_address(driver.address)
        job_env[channel.KEY_ENV] = driver.key.hex()
        if verbose >= 2:
            log(f"hora: {shlex.join(self.command)}")
        self._tail = collections.deque(maxlen=TAIL_LINES)
        self._proc = subprocess.Popen(self.command, env=job_env, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      start_new_session=True)
        self._relays = [
            threading.Thread(target=self._relay, args=(self._proc.stdout, stdout or sys.stdout),
                             daemon=True),
            threading.Thread(target=self._relay, args=(self._proc.stderr, stderr or sys.stderr),
                             daemon=True)]
        for thread in self._relays:
            thread.start()

    def _relay(self, pipe, sink):
        for line in io.TextIOWrapper(pipe, encoding="utf-8", errors="replace"):
            self._tail.append(line.rstrip("\n"))
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                pass

    def poll(self):
        return self._proc.poll()

    def wait(self, timeout=None):
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        for thread in self._relays:
            thread.join(timeout=5)
        return code

    def tail(self):
        return "\n".join(self._tail)

    def stop(self):
        if self._proc.poll() is None:
            processes.kill_tree(self._proc)
        for thread in self._relays:
            thread.join(timeout=5)
        self._scratch.cleanup()
