"""The program every rank runs: ``python -m hora.cluster.rank_main run|serve``.

``run``: fetch ``(fn, args, kwargs)`` from the driver, call it, send back the
result, or the exception's type and traceback and exit 1 (which stops the
job, as any failing rank does under horarun).

``serve``: for Ray. Make the executable object (if any), listen, tell the
driver where, then run every function the rank's actor sends until the actor
says stop. A function that raises is reported to its caller and then ends
the whole job: the other ranks may already wait in a collective for this
one, and MPI offers no way to take part of a job back.
"""
import queue
import socket
import sys
import time
import traceback

from hora.cluster import channel
from hora.runner.rank_exec import rank_info


def _describe_failure(exc):
    """(type name, traceback text, when)."""
    return (type(exc).__name__,
            "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            time.time())


def _send_result(driver, key, rank, hostname, ok, payload, error_type="", failed_at=0.0):
    with channel.connect(driver, key) as conn:
        conn.send(("result", rank, hostname, ok, payload, error_type, failed_at))
        conn.recv()


def _fetch_job(rank, driver, key):
    """What the driver set for the ranks to run, unpickled."""
    with channel.connect(driver, key) as conn:
        conn.send(("job", rank))
        reply = conn.recv()
    if reply[0] != "ok":
        raise RuntimeError(f"rank {rank}: {reply[1]}")
    return channel.loads(reply[1])


def run_once(rank, hostname, driver, key):
    try:
        fn, args, kwargs = _fetch_job(rank, driver, key)
        result = channel.dumps(fn(*args, **kwargs))
    except SystemExit:
        # how an elastic rank leaves for the next world (or leaves the job
        # in place): its exit status tells horarun, and it returns nothing
        raise
    except BaseException as exc:  # noqa: BLE001 - every failure goes to the driver
        error_type, text, failed_at = _describe_failure(exc)
        _send_result(driver, key, rank, hostname, False, text, error_type, failed_at)
        return 1
    _send_result(driver, key, rank, hostname, True, result)
    return 0


def serve(rank, hostname, driver, key):
    executable_cls, executable_args, executable_kwargs = _fetch_job(rank, driver, key)
    executable = None
    startup_error = None
    if executable_cls is not None:
        try:
            executable = executable_cls(*executable_args, **executable_kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported at the first call
            startup_error = _describe_failure(exc)
    arrived = queue.Queue()
    server = channel.Server(key, lambda conn, _peer_ip: arrived.put(conn))
    with channel.connect(driver, key) as conn:
        conn.send(("rank_ready", rank, hostname, server.port))
        conn.recv()
    actor = arrived.get()
    server.close()
    with actor:
        while True:
            try:
                request = actor.recv()
            except (EOFError, OSError):
                # the actor is gone without saying stop: it died, and the
                # job cannot go on without this rank
                print(f"hora: rank {rank}: its Ray actor is gone; ending the job",
                      file=sys.stderr, flush=True)
                return 1
            if request[0] == "stop":
                actor.send(("ok", channel.dumps(None)))
                return 0
            try:
                if startup_error is not None:
                    raise RuntimeError(f"{startup_error[0]} while making the executable "
                                       f"object on this rank:\n{startup_error[1]}")
                fn, args, kwargs, with_executable = channel.loads(request[1])
                value = fn(executable, *args, **kwargs) if with_executable else \
                    fn(*args, **kwargs)
                actor.send(("ok", channel.dumps(value)))
            except BaseException as exc:  # noqa: BLE001 - every failure goes to the caller
                actor.send(("error",) + _describe_failure(exc))
                return 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    mode = argv[0] if argv else ""
    if mode not in ("run", "serve"):
        print("usage: python -m hora.cluster.rank_main run|serve", file=sys.stderr)
        return 2
    rank = rank_info()[0]
    hostname = socket.gethostname()
    driver, key = channel.driver_from_env(), channel.key_from_env()
    return (run_once if mode == "run" else serve)(rank, hostname, driver, key)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # hora's own atexit handlers (engine shutdown) have run by the time
    # sys.exit returns control; a plain exit keeps them.
    sys.exit(code)
