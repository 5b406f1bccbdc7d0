"""horarun's own launch, for jobs over hora's TCP transport
(``horarun --transport tcp``): what mpirun does for an MPI job, without an
MPI runtime.

It starts every rank (on this host directly, on other hosts through the
remote shell, ``ssh`` by default), serves the rendezvous through which the
ranks form their worlds (:mod:`hora.runner.rendezvous`), relays their
output, and exits once every rank has. A rank that ends is reported to the
rendezvous at once, so in an in-place elastic job the survivors form the
next world without it; as no daemon of a runtime sits on the other hosts,
losing a whole host is losing its ranks, and the others go on.

horarun runs it in place of mpirun (and watches it the same way: the
ranks' wrapper, :mod:`hora.runner.rank_exec`, reports each rank's start
and end on its output). On SIGTERM it ends every rank.

Usage: python -m hora.runner.tcp_launch --np N [--hosts H:S,...]
       [--remote-shell CMD] [--address HOST] [--env-names A,B,...] -- COMMAND...
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time

from hora.common.elastic.growth import NO_SLOT
from hora.runner import hosts as hostlib
from hora.runner import markers
from hora.runner.rendezvous import Rendezvous

LOCAL_NAMES = {"localhost", "127.0.0.1", socket.gethostname()}
# After SIGTERM, the ranks get this long before SIGKILL.
STOP_GRACE_S = 5.0
# A world's request for replacements waits at most this long for the ends
# of the processes they replace to be handled here.
SPAWN_WAIT_S = 3.0


def placements(num_proc: int, host_list: list[hostlib.Host]) -> list[tuple[str, int, int]]:
    """(host, local rank, local size) of each rank: the hosts' slots filled
    in order, as mpirun's default mapping does."""
    result: list[tuple[str, int, int]] = []
    for host in host_list:
        take = min(host.slots, num_proc - len(result))
        result += [(host.name, local, take) for local in range(take)]
        if len(result) == num_proc:
            return result
    raise ValueError(f"{num_proc} ranks do not fit in the hosts' "
                     f"{sum(h.slots for h in host_list)} slots")


def free_slots(capacity: dict[str, int], alive_hosts: list[str],
               lost_hosts: set[str]) -> list[hostlib.Host]:
    """Where replacements can go: each host's slots (``capacity``, in the
    job's host order) less those its live processes (``alive_hosts``, one
    entry each) hold; none on a host lost whole."""
    return [hostlib.Host(name, slots - alive_hosts.count(name))
            for name, slots in capacity.items()
            if name not in lost_hosts and slots > alive_hosts.count(name)]


def _relay(pipe, sink, rank, ended):
    """Copies a rank's output; notes the wrapper's own report of its end."""
    for line in iter(pipe.readline, b""):
        marker = markers.decode(line)
        if marker is not None and marker.event == "exited" and marker.rank == rank:
            ended.set()
        try:
            sink.write(line)
            sink.flush()
        except (OSError, ValueError):
            pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hora.runner.tcp_launch")
    parser.add_argument("--np", type=int, required=True)
    parser.add_argument("--hosts", default="")
    parser.add_argument("--remote-shell", default="ssh")
    parser.add_argument("--address", default=None,
                        help="where ranks on other hosts reach this host")
    parser.add_argument("--env-names", default="",
                        help="variables given to ranks on other hosts")
    parser.add_argument("--form-timeout", type=float, default=10.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    host_list = (hostlib.parse_host_string(args.hosts) if args.hosts
                 else [hostlib.Host("localhost", args.np)])
    try:
        places = placements(args.np, host_list)
    except ValueError as exc:
        print(f"horarun: {exc}", file=sys.stderr)
        return 2
    procs: dict[int, subprocess.Popen] = {}
    relays: dict[int, list[threading.Thread]] = {}
    reported: dict[int, threading.Event] = {}
    hosts_of: dict[int, str] = {}
    # the job's slots per host (the launch's, and those growth added), the
    # processes whose end was handled, and the hosts lost whole (their
    # processes' wrappers ended with them; a growth onto one takes it back
    # with the slots it names)
    capacity: dict[str, int] = {}
    for host, _, _ in places:
        capacity[host] = capacity.get(host, 0) + 1
    handled: set[int] = set()
    lost_hosts: set[str] = set()
    lock = threading.Lock()
    names = [n for n in args.env_names.split(",") if n and n in os.environ]

    def end(process_id: int, why: str) -> None:
        with lock:
            proc = procs.get(process_id)
        if proc is not None and proc.poll() is None:
            proc.kill()

    def start(process_id: int, host: str, place: dict[str, str], cmd: list[str]) -> None:
        """Starts one process (the launch's ranks, or those a world asked for)."""
        if host in LOCAL_NAMES:
            env = dict(os.environ, **rendezvous.env(process_id, "127.0.0.1"), **place)
        else:
            address = args.address or socket.gethostname()
            given = {n: os.environ[n] for n in names}
            given.update(rendezvous.env(process_id, address), **place)
            env = dict(os.environ)
            # one string, quoted: the remote shell (ssh's) splits it again
            cmd = [*shlex.split(args.remote_shell), host,
                   shlex.join(["env", *(f"{k}={v}" for k, v in given.items()), *cmd])]
        try:
            proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        except OSError as exc:
            print(f"horarun: cannot start process {process_id} on {host}: {exc}",
                  file=sys.stderr, flush=True)
            rendezvous.lost(process_id, "it could not be started")
            return
        ended = threading.Event()
        threads = [threading.Thread(target=_relay, args=(pipe, sink, process_id, ended),
                                    daemon=True)
                   for pipe, sink in ((proc.stdout, sys.stdout.buffer),
                                      (proc.stderr, sys.stderr.buffer))]
        with lock:
            procs[process_id] = proc
            reported[process_id] = ended
            relays[process_id] = threads
            hosts_of[process_id] = host
        for thread in threads:
            thread.start()

    def spawn(ids: list[int], hosts: list[str], cmd: list[str]) -> None:
        """A world's processes to join it (in the background: the ends of
        the processes they replace may still be on their way)."""
        threading.Thread(target=spawn_now, args=(ids, hosts, cmd), daemon=True,
                         name="hora-launch-spawn").start()

    def spawn_now(ids: list[int], hosts: list[str], cmd: list[str]) -> None:
        """Starts them where ``hosts`` says (new slots), else in the slots
        of the processes that ended, never on a host lost whole."""
        if hosts:
            wanted = hostlib.parse_host_string(",".join(hosts))
            with lock:
                for host in wanted:
                    before = 0 if host.name in lost_hosts else capacity.get(host.name, 0)
                    capacity[host.name] = before + host.slots
                    lost_hosts.discard(host.name)
        else:
            # Wait (briefly) until the ends of the processes the world lost
            # were handled: whether their host went with them is known then.
            deadline = time.monotonic() + SPAWN_WAIT_S
            while True:
                alive = set(rendezvous.alive()) - set(ids)
                with lock:
                    pending = [i for i in procs if i not in alive and i not in handled]
                if not pending or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            with lock:
                lost = sorted(lost_hosts)
                alive_hosts = [hosts_of[i] for i in alive if i in hosts_of]
                wanted = free_slots(capacity, alive_hosts, lost_hosts)
                short = len(ids) - sum(h.slots for h in wanted)
                if short > 0 and not lost:
                    # a job on this machine grown by discovery (it names no
                    # host): the new slots are the launch host's
                    capacity[next(iter(capacity))] += short
                    wanted = free_slots(capacity, alive_hosts, lost_hosts)
            if short > 0 and lost:
                why = f"{NO_SLOT} (host(s) {', '.join(lost)} lost with their processes)"
                for process_id in ids:
                    rendezvous.lost(process_id, why)
                return
        where = placements(len(ids), wanted)
        for index, (process_id, (host, local_rank, local_size)) in enumerate(zip(ids, where)):
            start(process_id, host, {"HORA_LAUNCH_RANK": str(index),
                                     "HORA_LAUNCH_SIZE": str(len(ids)),
                                     "HORA_LAUNCH_LOCAL_RANK": str(local_rank),
                                     "HORA_LAUNCH_LOCAL_SIZE": str(local_size)}, cmd)

    rendezvous = Rendezvous(list(range(args.np)), form_timeout=args.form_timeout, on_lost=end,
                            on_spawn=spawn,
                            log=lambda text: print(f"horarun: {text}", file=sys.stderr,
                                                   flush=True))
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    for rank, (host, local_rank, local_size) in enumerate(places):
        start(rank, host, {"HORA_LAUNCH_RANK": str(rank), "HORA_LAUNCH_SIZE": str(args.np),
                           "HORA_LAUNCH_LOCAL_RANK": str(local_rank),
                           "HORA_LAUNCH_LOCAL_SIZE": str(local_size)}, command)
    codes: dict[int, int] = {}
    stop_at = None
    while True:
        with lock:
            running = dict(procs)
        if len(codes) == len(running):
            break
        for rank, proc in running.items():
            if rank not in codes and proc.poll() is not None:
                codes[rank] = proc.returncode
                if proc.returncode != 0:
                    rendezvous.lost(rank, f"it ended with {proc.returncode}")
                for thread in relays[rank]:
                    thread.join(1.0)
                if not reported[rank].is_set():
                    # Its wrapper went with it (a host lost whole): horarun
                    # hears of its end from here instead.
                    if hosts_of[rank] not in LOCAL_NAMES:
                        with lock:
                            lost_hosts.add(hosts_of[rank])
                    code = proc.returncode
                    outcome = (f"signal={markers.signal_name(-code)}" if code < 0
                               else f"code={code or 1}")
                    marker = markers.Marker("exited", rank, hosts_of[rank], outcome, time.time())
                    sys.stdout.buffer.write(markers.encode(marker))
                    sys.stdout.buffer.flush()
                with lock:
                    handled.add(rank)
        if stopping.is_set() and stop_at is None:
            stop_at = time.monotonic() + STOP_GRACE_S
            for rank, proc in running.items():
                if rank not in codes:
                    _signal(proc, signal.SIGTERM)
        if stop_at is not None and time.monotonic() > stop_at:
            for rank, proc in running.items():
                if rank not in codes:
                    _signal(proc, signal.SIGKILL)
        time.sleep(0.05)
    rendezvous.close()
    return 0 if all(code == 0 for code in codes.values()) else 1


def _signal(proc: subprocess.Popen, signum: int) -> None:
    try:
        os.killpg(proc.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main())
