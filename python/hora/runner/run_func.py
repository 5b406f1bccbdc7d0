"""``hora.run(func, num_proc=N)``: Horovod's ``horovod.run`` from Python.

It starts ``horarun`` with the options given, every rank calls
``func(*args, **kwargs)`` (sent to it, pickled with cloudpickle, by a small
service in this process, which also collects the return values), and the
values come back as a list in rank order. The ranks' output goes to this
process's stdout and stderr with horarun's ``[rank]`` prefixes. A rank that
raises ends the job and raises :class:`hora.cluster.job.JobError` here
(a ``RuntimeError``), naming the rank and host, with its traceback.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any


def _options(num_proc: int, min_num_proc: int | None, max_num_proc: int | None,
             slots: int | None, reset_limit: int | None,
             cooldown_range: Iterable[float] | None, hosts: str | None, hostfile: str | None,
             host_discovery_script: str | None, start_timeout: float | None,
             ssh_port: int | None, ssh_identity_file: str | None, disable_cache: bool | None,
             output_filename: str | None, verbose: Any, mpi_args: str | None,
             network_interfaces: Iterable[str] | None) -> list[str]:
    """horarun's options for Horovod's ``run`` arguments."""
    options = ["-np", str(num_proc)]
    if hosts is not None:
        options += ["-H", hosts]
    if hostfile is not None:
        options += ["--hostfile", hostfile]
    for flag, value in (("--min-np", min_num_proc), ("--max-np", max_num_proc),
                        ("--slots-per-host", slots), ("--reset-limit", reset_limit),
                        ("--host-discovery-script", host_discovery_script),
                        ("--start-timeout", start_timeout),
                        ("--output-filename", output_filename)):
        if value is not None:
            options += [flag, str(value)]
    if cooldown_range is not None:
        low, high = cooldown_range
        options += ["--blacklist-cooldown-range", str(low), str(high)]
    if disable_cache:
        options.append("--disable-cache")
    if verbose:
        options.append("--verbose")
    extra = shlex.split(mpi_args) if mpi_args else []
    ssh = []
    if ssh_port is not None:
        ssh += ["-p", str(ssh_port)]
    if ssh_identity_file is not None:
        ssh += ["-i", ssh_identity_file]
    if ssh:
        # how Horovod passes them to Open MPI's launcher
        extra += ["--mca", "plm_rsh_args", shlex.join(ssh)]
    if network_interfaces:
        extra += ["--mca", "btl_tcp_if_include", ",".join(network_interfaces)]
    if extra:
        options += ["--mpi-args", shlex.join(extra)]
    return options


def _rank_python_path(current: str) -> str:
    """The ranks' PYTHONPATH: this process's own import directories (not
    its Python's installation) before ``current``, so that a function of a
    module this process imported from one of them (a script's directory, a
    notebook's ``sys.path.append``) unpickles on the ranks too."""
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    own = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or any(path == p or path.startswith(p + os.sep)
                                           for p in installed):
            continue
        if path not in own:
            own.append(path)
    return os.pathsep.join(own + ([current] if current else []))


def run(func: Callable[..., Any], args: tuple = (), kwargs: dict[str, Any] | None = None,
        num_proc: int = 1, min_num_proc: int | None = None, max_num_proc: int | None = None,
        slots: int | None = None, reset_limit: int | None = None,
        cooldown_range: Iterable[float] | None = None, hosts: str | None = None,
        hostfile: str | None = None, host_discovery_script: str | None = None,
        start_timeout: float | None = None, ssh_port: int | None = None,
        ssh_identity_file: str | None = None, disable_cache: bool | None = None,
        output_filename: str | None = None, verbose: Any = None, use_gloo: bool | None = None,
        use_mpi: bool | None = None, mpi_args: str | None = None,
        network_interface: str | None = None,
        network_interfaces: Iterable[str] | None = None, executable: str | None = None,
        np: int | None = None, min_np: int | None = None, max_np: int | None = None) -> list[Any]:
    """Runs ``func(*args, **kwargs)`` on ``num_proc`` ranks and returns the
    values it returned, in rank order (Horovod's ``horovod.run``, with its
    parameters and deprecations). ``min_num_proc``, ``max_num_proc`` or a
    ``host_discovery_script`` make it an elastic job; then only the first
    ``min_num_proc`` results are returned, if set, as in Horovod.
    ``use_gloo=True`` raises ``ValueError``: hora's ranks talk over MPI."""
    if network_interface:
        network_interfaces = network_interface.split(",")
        warnings.warn("network_interface is deprecated, use network_interfaces instead",
                      DeprecationWarning, stacklevel=2)
    if np is not None:
        num_proc = np
        warnings.warn("np is deprecated, use num_proc instead", DeprecationWarning,
                      stacklevel=2)
    if min_np is not None:
        min_num_proc = min_np
        warnings.warn("min_np is deprecated, use min_num_proc instead", DeprecationWarning,
                      stacklevel=2)
    if max_np is not None:
        max_num_proc = max_np
        warnings.warn("max_np is deprecated, use max_num_proc instead", DeprecationWarning,
                      stacklevel=2)
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    if use_gloo:
        raise ValueError("hora.run: use_gloo=True: hora has no Gloo controller; its ranks talk "
                         "over MPI (leave use_gloo unset)")
    if not callable(func):
        raise TypeError(f"hora.run: func must be callable, got {type(func).__name__}")

    from hora.cluster import channel
    from hora.cluster.driver_service import DriverService
    from hora.cluster.job import JobError, rank_failure, root_cause_order

    options = _options(num_proc, min_num_proc, max_num_proc, slots, reset_limit, cooldown_range,
                       hosts, hostfile, host_discovery_script, start_timeout, ssh_port,
                       ssh_identity_file, disable_cache, output_filename, verbose, mpi_args,
                       network_interfaces)
    key = channel.new_key()
    driver = DriverService(key, channel.local_address())
    try:
        driver.set_job(channel.dumps((func, tuple(args), dict(kwargs or {}))))
        env = dict(os.environ)
        env[channel.DRIVER_ENV] = channel.format_address(driver.address)
        env[channel.KEY_ENV] = key.hex()
        env["PYTHONPATH"] = _rank_python_path(env.get("PYTHONPATH", ""))
        command = [sys.executable, "-m", "hora.runner", *options, "--",
                   executable or sys.executable, "-m", "hora.cluster.rank_main", "run"]
        code = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, check=False).returncode
        results = driver.results()
    finally:
        driver.close()
    failed = sorted((r for r in results.values() if not r.ok),
                    key=lambda r: root_cause_order(r.error_type, r.failed_at, r.rank))
    if code != 0:
        if failed:
            raise rank_failure("hora.run", failed[0])
        raise JobError(f"hora.run: the job ended with exit code {code} (horarun's messages "
                       f"above say why)")
    done = {rank: r for rank, r in results.items() if r.ok}
    elastic = (min_num_proc is not None or max_num_proc is not None
               or host_discovery_script is not None)
    count = 0
    while count in done:
        count += 1
    missing = sorted(set(range(num_proc)) - set(done))
    if count == 0 or (not elastic and missing):
        raise JobError(f"hora.run: the job ended (exit code 0) without a value from ranks "
                       f"{missing}: did func leave through sys.exit?")
    values = [channel.loads(done[rank].payload) for rank in range(count)]
    return values[:min_num_proc] if min_num_proc is not None else values
