"""Per-rank wrapper that mpirun starts:
``python -m hora.runner.rank_exec [--output-dir DIR] -- cmd args...``.

It turns the launcher's own rank variables into HORA_* and HOROVOD_* ones,
runs the command, and puts ``[rank] `` before every line the command prints,
so that the interleaved output of many ranks stays readable (or, with
``--output-dir``, writes the rank's stdout and stderr to
``DIR/rank.N/stdout`` and ``DIR/rank.N/stderr``). It tells horarun when the
rank starts and how it ended (see ``markers``), and never leaves the command
running once it is gone itself or mpirun is.
"""
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from hora.runner import markers

# Each launcher names the same facts differently; the first one present wins.
# (HORA_LAUNCH_*: horarun's own launch, hora.runner.tcp_launch)
_RANK_SOURCES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "HORA_LAUNCH_RANK")
_SIZE_SOURCES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "HORA_LAUNCH_SIZE")
_LOCAL_RANK_SOURCES = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "HORA_LAUNCH_LOCAL_RANK")
_LOCAL_SIZE_SOURCES = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "HORA_LAUNCH_LOCAL_SIZE")

_USAGE = "usage: python -m hora.runner.rank_exec [--output-dir DIR] -- command [args...]"
_PR_SET_PDEATHSIG = 1
# How often the wrapper checks that mpirun's daemon (its parent) still lives,
# and how long the command then gets to exit on SIGTERM before SIGKILL.
_PARENT_POLL_S = 0.5
# In place: how long a rank may stay stopped (SIGSTOP) before its wrapper
# kills it (HORA_ELASTIC_STOPPED_SECONDS; 0: never).
_STOPPED_S = 10.0
_TERM_GRACE_S = 5.0
# Once the command has exited, how long its output may still take to drain:
# a background process it started (``sleep 45 &``) holds the pipes open
# but is not the rank, and the rank's end must not wait for it.
_DRAIN_S = 2.0


class RankEnvError(RuntimeError):
    """The environment does not say which rank this process is."""


def _first_int(env, names):
    for name in names:
        value = env.get(name)
        if value is not None and value != "":
            try:
                return int(value)
            except ValueError:
                raise RankEnvError(f"{name}={value!r} is not a whole number") from None
    return None


def rank_info(env=None):
    """Read (rank, size, local_rank, local_size) from the MPI launcher's variables."""
    env = os.environ if env is None else env
    rank = _first_int(env, _RANK_SOURCES)
    size = _first_int(env, _SIZE_SOURCES)
    if rank is None or size is None:
        missing = "rank" if rank is None else "world size"
        raise RankEnvError(
            f"no MPI {missing} in the environment (looked for "
            f"{', '.join(_RANK_SOURCES if rank is None else _SIZE_SOURCES)}); "
            "this module is meant to be started by horarun through mpirun"
        )
    local_rank = _first_int(env, _LOCAL_RANK_SOURCES)
    local_size = _first_int(env, _LOCAL_SIZE_SOURCES)
    # Open MPI and Hydra both say; a launcher that does not is taken to have
    # started every rank on one host.
    if local_rank is None:
        local_rank = rank
    if local_size is None:
        local_size = size
    return rank, size, local_rank, local_size


def joiner_info(env, rank, size, local_rank, local_size):
    """For a replacement process that an in-place elastic world started
    (hora.common.elastic.growth): (its id for horarun, and the rank, size,
    local rank and local size its program sees), from what the world told
    it and the launcher's numbering of the processes started together.
    None for a rank of the launch."""
    if "HORA_ELASTIC_JOINER_ID" not in env:
        return None
    try:
        first_id = int(env["HORA_ELASTIC_JOINER_ID"])
        first_rank = int(env.get("HORA_ELASTIC_JOINER_RANK", "0"))
        target = int(env.get("HORA_ELASTIC_TARGET_SIZE", "0"))
    except ValueError:
        raise RankEnvError("HORA_ELASTIC_JOINER_* are not whole numbers") from None
    return first_id + rank, (first_rank + rank, max(target, first_rank + size), local_rank,
                             local_size)


def is_new_slot(env, rank, size):
    """Whether the process ``rank`` of ``size`` started together by an
    in-place elastic world fills a new slot (rather than a lost rank's)."""
    try:
        new = int(env.get("HORA_ELASTIC_JOINER_NEW", "0") or 0)
    except ValueError:
        raise RankEnvError("HORA_ELASTIC_JOINER_NEW is not a whole number") from None
    return rank >= size - new


def thread_share(env, local_size):
    """OMP_NUM_THREADS for a rank, unless it has one (the user's, or
    horarun's on one host): its share of this host's cores, among the
    ranks on this host."""
    if "OMP_NUM_THREADS" in env:
        return env["OMP_NUM_THREADS"]
    return str(max(1, len(os.sched_getaffinity(0)) // max(1, local_size)))


def rank_env(rank, size, local_rank, local_size):
    """The variables hora and Horovod-style scripts read to learn their place."""
    values = {"RANK": rank, "SIZE": size, "LOCAL_RANK": local_rank, "LOCAL_SIZE": local_size}
    env = {}
    for key, value in values.items():
        env["HORA_" + key] = str(value)
        env["HOROVOD_" + key] = str(value)
    return env


def relay(source, sink, prefix, stamped=False):
    """Copy ``source`` to ``sink`` as bytes, putting ``prefix`` before each line
    (and, when ``stamped``, the date and time before that).

    A line is only written once it is complete, and in a single write, so that
    lines from different ranks never get spliced together mid-line.
    """
    def head():
        if not stamped:
            return prefix
        return time.strftime("%a %b %d %H:%M:%S %Y ").encode() + prefix

    pending = b""
    while True:
        chunk = source.read1(65536)
        if not chunk:
            break
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop()
        if lines:
            start = head()
            sink = _write(sink, b"".join(start + line + b"\n" for line in lines))
    if pending:
        # Terminate the last partial line: otherwise the next rank's output
        # would be glued onto it.
        _write(sink, head() + pending + b"\n")


def _write(sink, data):
    # If our own output is gone (closed pipe), keep draining the child anyway
    # so it does not block on a full pipe; just stop writing.
    if sink is None:
        return None
    try:
        sink.write(data)
        sink.flush()
        return sink
    except (OSError, ValueError):
        return None


def _relay_reports(source, rank, host):
    """Turns the command's reports (``raised TIME own|peer|peer=N`` lines on the
    pipe named by HORA_RUNNER_REPORT_FD) into markers for horarun."""
    with os.fdopen(source, "rb") as reports:
        for line in reports:
            fields = line.split()
            if len(fields) != 3 or fields[0] != b"raised" or not (
                    fields[2] in (b"own", b"peer") or re.fullmatch(rb"peer=\d+", fields[2])):
                continue
            try:
                when = float(fields[1])
            except ValueError:
                continue
            marker = markers.Marker("raised", rank, host, fields[2].decode(), when)
            _write(sys.stdout.buffer, markers.encode(marker))


def _write_exited(rank, host, outcome):
    """The marker the supervisor reads this rank's end from."""
    marker = markers.Marker("exited", rank, host, outcome, time.time())
    _write(sys.stdout.buffer, markers.encode(marker))


def _forward_signals(child):
    # mpirun signals us, not our child; pass the request on so the user's
    # program gets the chance to shut down cleanly.
    def forward(signum, _frame):
        child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)


def host_name(env=None):
    """The host name mpirun knows this rank's host by (it can differ from
    gethostname(), e.g. for network namespaces standing in for hosts)."""
    env = os.environ if env is None else env
    return env.get("PMIX_HOSTNAME") or env.get("HORA_HOSTNAME") or socket.gethostname()


def die_with_parent():
    """preexec_fn: runs in the child between fork and exec. When the thread
    that started the child dies (even by SIGKILL), the kernel kills the
    child too (Linux), so nothing is orphaned."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def process_state(pid):
    """The state letter Linux gives process ``pid`` (``R``, ``S``, ``T`` for
    stopped, ``t`` for stopped by a debugger, ...), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def _watch(child, parent, stopped_limit, rank, prefix):
    # mpirun's daemon is our parent; when it goes away without stopping us
    # (killed with SIGKILL), stop the command rather than run on unowned.
    # In place (stopped_limit > 0), a command stopped (SIGSTOP, a debugger)
    # for that long is killed: the other ranks then go on without it, as
    # after any lost rank, where they would otherwise wait for it.
    stopped_since = None
    while child.poll() is None:
        if os.getppid() != parent:
            child.terminate()
            deadline = time.monotonic() + _TERM_GRACE_S
            while child.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if child.poll() is None:
                child.kill()
            return
        if stopped_limit > 0:
            now = time.monotonic()
            if process_state(child.pid) not in ("T", "t"):
                stopped_since = None
            elif stopped_since is None:
                stopped_since = now
            elif now - stopped_since >= stopped_limit:
                _write(sys.stderr.buffer, prefix + (
                    f"rank {rank} has been stopped for {stopped_limit:g} s; killing it so that "
                    f"the others go on in place\n").encode())
                child.kill()
                return
        time.sleep(_PARENT_POLL_S)


def _parse(argv):
    output_dir = None
    while argv and argv[0] != "--":
        if argv[0] == "--output-dir" and len(argv) > 1:
            output_dir = argv[1]
            argv = argv[2:]
        else:
            return None, None
    return output_dir, argv[1:]


def _outcome(code):
    return f"signal={markers.signal_name(-code)}" if code < 0 else f"code={code}"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    launch_argv = list(argv)
    output_dir, argv = _parse(argv)
    if not argv:
        print(_USAGE, file=sys.stderr)
        return 2

    try:
        rank, size, local_rank, local_size = rank_info()
        place = (rank, size, local_rank, local_size)
        joiner = joiner_info(os.environ, *place)
    except RankEnvError as exc:
        print(f"hora.runner.rank_exec: {exc}", file=sys.stderr)
        return 2
    kind = ""
    if joiner is not None:
        # horarun knows this process by its id; its program by its rank in
        # the world it joins; the last HORA_ELASTIC_JOINER_NEW of those
        # started together fill new slots, the others replace lost ranks
        kind = "new" if is_new_slot(os.environ, *place[:2]) else "replacement"
        rank, place = joiner
    prefix = f"[{rank}] ".encode()
    # horarun --prefix-output-with-timestamp
    stamped = os.environ.get("HORA_PREFIX_OUTPUT_TIMESTAMP") == "1"
    host = host_name()
    _write(sys.stdout.buffer, markers.encode(markers.Marker("started", rank, host, kind)))

    env = dict(os.environ)
    # The PATH of the shell that ran horarun (see hora.runner.cli.rank_path):
    # the launcher may have put its own bin directory first, and the command
    # must be what the user's shell would run.
    if env.get("HORA_RANK_PATH"):
        env["PATH"] = env["HORA_RANK_PATH"]
    env.update(rank_env(*place))
    env["OMP_NUM_THREADS"] = thread_share(env, place[3])
    # How this rank was started: an in-place elastic world starts its
    # replacements the same way (hora.common.elastic.growth).
    env["HORA_RANK_EXEC"] = json.dumps({"python": sys.executable, "argv": launch_argv})
    # The child's stdout is a pipe to us; without this, Python would buffer
    # it in blocks and lines would show up late and out of order.
    env["PYTHONUNBUFFERED"] = "1"

    files = []
    if output_dir is not None:
        try:
            directory = os.path.join(output_dir, f"rank.{rank}")
            os.makedirs(directory, exist_ok=True)
            files = [open(os.path.join(directory, name), "wb") for name in ("stdout", "stderr")]
        except OSError as exc:
            _write(sys.stderr.buffer,
                   prefix + f"cannot write output to {output_dir!r}: {exc}\n".encode())
            _write_exited(rank, host, "code=1")
            return 1
    out, err = (files[0], files[1]) if files else (subprocess.PIPE, subprocess.PIPE)

    parent = os.getppid()
    # A pipe on which hora, inside the command, says when it dies of an
    # uncaught exception (hora.common.failure_report).
    report_read, report_write = os.pipe()
    env["HORA_RUNNER_REPORT_FD"] = str(report_write)
    try:
        child = subprocess.Popen(argv, env=env, stdout=out, stderr=err, preexec_fn=die_with_parent,
                                 pass_fds=(report_write,))
    except OSError as exc:
        os.close(report_read)
        os.close(report_write)
        _write(sys.stderr.buffer, prefix + f"cannot run {argv[0]!r}: {exc.strerror}\n".encode())
        # The shell's conventions: 127 for not found, 126 for not runnable.
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        _write_exited(rank, host, f"code={code}")
        return code
    finally:
        for f in files:
            f.close()
    os.close(report_write)
    reports = threading.Thread(target=_relay_reports, args=(report_read, rank, host), daemon=True)
    reports.start()

    _forward_signals(child)
    stopped_limit = 0.0
    if env.get("HORA_ELASTIC_IN_PLACE") == "1":
        try:
            stopped_limit = float(env.get("HORA_ELASTIC_STOPPED_SECONDS", "") or _STOPPED_S)
        except ValueError:
            stopped_limit = _STOPPED_S
    threading.Thread(target=_watch, args=(child, parent, stopped_limit, rank, prefix),
                     daemon=True).start()
    relays = []
    if not files:
        relays = [
            threading.Thread(target=relay, args=(child.stdout, sys.stdout.buffer, prefix,
                                                 stamped),
                             daemon=True),
            threading.Thread(target=relay, args=(child.stderr, sys.stderr.buffer, prefix,
                                                 stamped),
                             daemon=True),
        ]
    for thread in relays:
        thread.start()
    code = child.wait()
    deadline = time.monotonic() + _DRAIN_S
    for thread in [*relays, reports]:
        thread.join(max(0.0, deadline - time.monotonic()))

    _write_exited(rank, host, _outcome(code))
    if code < 0:
        _write(sys.stderr.buffer,
               prefix + f"killed by signal {markers.signal_name(-code)}\n".encode())
    if code != 0 and env.get("HORA_ELASTIC_IN_PLACE") == "1":
        # The other ranks go on without this one (ULFM), and Open MPI tells
        # them of a lost process only when it ends abnormally: an exit code,
        # even a non-zero one, would leave them waiting for it.
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
