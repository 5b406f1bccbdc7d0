"""Runs mpirun and watches the job: relays its output, notices the first
rank to fail, enforces the start timeout, and stops everything on Ctrl-C.

mpirun (Open MPI, MPICH, Intel MPI alike) already tears a job down when a
rank exits non-zero; horarun names the culprit, and if mpirun has not
brought the job down soon after, stops it itself, so that a dead rank never
leaves the others waiting in a collective.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import queue
import re
import signal
import subprocess
import threading
import time
from typing import Any

from hora.runner import hosts as hostlib
from hora.runner import markers

# After the first rank fails, mpirun gets this long to stop the others
# before horarun sends it SIGTERM, and then this long before SIGKILL. Their
# sum stays well inside the 10 s within which every rank must be gone.
FAIL_FAST_GRACE_S = 4.0
KILL_GRACE_S = 2.0
# On Ctrl-C or SIGTERM the ranks get this long to exit before SIGKILL.
STOP_GRACE_S = 10.0
# After mpirun exits, output still in flight is drained for at most this
# long (a stray process holding the pipe open must not block horarun).
DRAIN_S = 5.0
# Open MPI 5's launcher occasionally fails to bring up its PMIx server (for
# instance when the list of network interfaces changes while it starts).
# When it says so and no rank has started, nothing has run yet, and the
# launch can simply be tried again.
TRANSIENT_START_FAILURES = (b"PMIx server's listener thread failed to start",)
# How mpirun (Open MPI 4's ORTE and 5's PRRTE) names a host whose daemon it
# lost (the host died, or its container was killed): "Remote daemon: [..] on
# node c2" after "lost communication with a remote daemon", or, when the ssh
# session to the host ended first, "Remote host: c2" in the message that
# begins "A daemon failed to report back".
LOST_DAEMON = re.compile(rb"Remote daemon\s*:\s*\S+ on node (\S+)")
DAEMON_NOT_BACK = b"daemon failed to report back"
DAEMON_NOT_BACK_HOST = re.compile(rb"^\s*Remote host\s*:\s*(\S+)")


@dataclasses.dataclass
class Outcome:
    code: int                       # what horarun exits with
    message: str = ""               # the one-line summary printed on failure
    first_failure: markers.Marker | None = None
    started: frozenset = frozenset()
    transient_start_failure: bool = False  # safe to launch again: see TRANSIENT_START_FAILURES
    stopped: bool = False           # by Ctrl-C or SIGTERM: not a failure to recover from
    lost_host: str | None = None    # the host whose daemon mpirun lost, as mpirun names it


class LiveRanks:
    """The ranks of the job under way that have started and not ended, by
    host: the elastic watcher reads it (in place, ranks on a host with fewer
    slots leave; a host whose ranks are all gone already only lowers the
    size). One job runs at a time in a horarun process."""

    def __init__(self):
        self._lock = threading.Lock()
        self._hosts: dict[int, str] = {}

    def reset(self):
        with self._lock:
            self._hosts.clear()

    def started(self, rank, host):
        with self._lock:
            self._hosts[rank] = host

    def ended(self, rank):
        with self._lock:
            self._hosts.pop(rank, None)

    def by_host(self):
        """How many live ranks each host (as they report it) holds."""
        with self._lock:
            counts: dict[str, int] = {}
            for host in self._hosts.values():
                counts[host] = counts.get(host, 0) + 1
            return counts


live_ranks = LiveRanks()


def _relay(pipe, sink, events):
    """Copies mpirun's output line by line, taking out the ranks' markers."""
    not_back = False  # inside mpirun's "A daemon failed to report back" message
    for line in iter(pipe.readline, b""):
        marker = markers.decode(line)
        if marker is not None:
            events.put(("marker", marker))
            continue
        if any(text in line for text in TRANSIENT_START_FAILURES):
            events.put(("transient", None))
        lost = LOST_DAEMON.search(line)
        if not_back and not lost:
            lost = DAEMON_NOT_BACK_HOST.search(line)
        if DAEMON_NOT_BACK in line:
            not_back = True
        elif lost or line.startswith(b"-----"):
            not_back = False
        if lost:
            events.put(("host_lost", lost.group(1).decode(errors="replace")))
        try:
            sink.write(line)
            sink.flush()
        except (OSError, ValueError):
            pass  # our own output is gone; keep draining so mpirun never blocks
    events.put(("eof", None))


class _Job:
    def __init__(self, proc):
        self.proc = proc
        self.term_at = None   # when to send SIGTERM to mpirun
        self.kill_at = None   # when to SIGKILL mpirun's process group

    def terminate(self, at, grace):
        """SIGTERM to mpirun at time ``at`` (unless one is due sooner), and
        SIGKILL to its whole process group ``grace`` seconds later."""
        if self.term_at is None or self.term_at > at:
            self.term_at = at
            self.kill_at = at + grace

    def tick(self, now):
        if self.term_at is not None and now >= self.term_at:
            self.term_at = float("inf")
            self._send(signal.SIGTERM)
        if self.kill_at is not None and now >= self.kill_at:
            self.kill_at = None
            self._send(signal.SIGKILL, group=True)

    def _send(self, signum, group=False):
        try:
            if group:
                os.killpg(self.proc.pid, signum)
            else:
                self.proc.send_signal(signum)
        except (ProcessLookupError, PermissionError):
            pass


# Looked up before any fork: the child between fork and exec only calls it.
_PRCTL: Any
try:
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None
_PR_SET_PDEATHSIG = 1


def _end_with_horarun():
    """preexec_fn for mpirun: SIGTERM when the thread that started it (the
    main thread, which lives as long as horarun) dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def run(cmd, num_proc, start_timeout, stdout, stderr, log, env=None, in_place=False):
    """Runs ``cmd`` (an mpirun command line) and returns an Outcome.

    ``stdout``/``stderr`` receive the job's output (binary streams), ``log``
    is called with horarun's own messages; ``env`` is mpirun's environment
    (default: this process's). With ``in_place`` (elastic recovery in
    place) a failed rank does not stop the others: the job succeeds when
    every rank that did not fail exits with 0.
    """
    events = queue.Queue()
    live_ranks.reset()
    # A session of its own: a Ctrl-C in the terminal reaches horarun only,
    # which passes on exactly one stop request (two make mpirun abort
    # without cleaning up).
    # mpirun ends with horarun, even when horarun is SIGKILLed: it then
    # gets SIGTERM and takes the ranks down with it, so that no job trains
    # on unwatched (an elastic one would delete its commit at the end).
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, env=env,
                            preexec_fn=_end_with_horarun)
    relays = [threading.Thread(target=_relay, args=(proc.stdout, stdout, events), daemon=True),
              threading.Thread(target=_relay, args=(proc.stderr, stderr, events), daemon=True)]
    for thread in relays:
        thread.start()

    def on_signal(signum, _frame):
        events.put(("signal", signum))

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    job = _Job(proc)
    started, stop_signal, start_expired = set(), None, False
    exited = set()
    # rank -> its "raised" marker; rank -> its failed exit (while the job
    # was not being stopped anyway)
    raised, failures = {}, {}
    hosts = {}  # rank -> host, from "started"
    lost_host = None  # the first host whose daemon mpirun lost, as mpirun names it
    transient = False
    start_deadline = time.monotonic() + start_timeout if start_timeout else None

    def handle(kind, value, now):
        nonlocal stop_signal, transient, lost_host
        if kind == "transient":
            transient = True
        elif kind == "host_lost":
            lost_host = lost_host or value
        elif kind == "marker":
            if value.event == "started":
                started.add(value.rank)
                hosts[value.rank] = value.host
                live_ranks.started(value.rank, value.host)
                if value.rank >= num_proc:  # started by the world, in place
                    what = "new" if value.outcome == "new" else "replacement"
                    log(f"horarun: {what} process {value.rank} started on host {value.host}")
            elif value.event == "exited":
                exited.add(value.rank)
                live_ranks.ended(value.rank)
            elif value.event == "raised":
                raised.setdefault(value.rank, value)
            if value.failed and stop_signal is None and not start_expired:
                # Markers from different hosts can arrive out of order (a
                # peer that lost its connection may report before the host
                # of the rank that died does): see _cause.
                if in_place:
                    log(f"horarun: rank {value.rank} on host {value.host} failed "
                        f"({value.describe()}); the other ranks go on in place")
                elif not failures:
                    job.terminate(now + FAIL_FAST_GRACE_S, KILL_GRACE_S)
                failures[value.rank] = value
        elif kind == "signal":
            if stop_signal is None:
                stop_signal = value
                log(f"horarun: got {markers.signal_name(value)}; stopping every rank "
                    f"(again to kill them at once)")
                job.terminate(now, STOP_GRACE_S)
            else:
                job.terminate(now, 0)

    try:
        while proc.poll() is None:
            try:
                kind, value = events.get(timeout=0.1)
            except queue.Empty:
                kind = value = None
            now = time.monotonic()
            if kind is not None:
                handle(kind, value, now)
            if (start_deadline is not None and now > start_deadline
                    and len(started & set(range(num_proc))) < num_proc
                    and not start_expired and stop_signal is None and not failures):
                start_expired = True
                missing = sorted(set(range(num_proc)) - started)
                log(f"horarun: only {len(started)} of {num_proc} ranks started within "
                    f"{start_timeout:g} s (--start-timeout); still missing: "
                    f"{_rank_list(missing)}; stopping the job")
                job.terminate(now, KILL_GRACE_S)
            job.tick(now)
        code = proc.returncode
        # Output (and markers) that were still in the pipes.
        deadline = time.monotonic() + DRAIN_S
        for thread in relays:
            thread.join(max(0.0, deadline - time.monotonic()))
        while True:
            try:
                kind, value = events.get_nowait()
            except queue.Empty:
                break
            if kind in ("marker", "transient", "host_lost"):
                handle(kind, value, time.monotonic())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if proc.poll() is None:
            proc.kill()

    survivors = sorted(exited - set(failures))
    if (in_place and failures and survivors and stop_signal is None and not start_expired
            and set(survivors) | set(failures) >= set(range(num_proc)) | started):
        # Every rank that did not fail ended well (and so did every
        # replacement that did not): the job finished in place.
        return Outcome(0, f"horarun: rank(s) {_rank_list(sorted(failures))} failed; ranks "
                          f"{_rank_list(survivors)} finished in place", started=frozenset(started))
    cause = _cause(failures, raised, hosts)
    lost = _lost_ranks(lost_host, hosts, exited)
    if lost is not None and cause is not None and not _raised_its_own(cause.rank, raised):
        # The ranks left behind fail on the lost host's account (a lost
        # peer), possibly before mpirun reports the host: the host is the cause.
        code = cause.exit_code()
        cause = None
    outcome = _outcome(code, num_proc, started, cause, stop_signal, start_expired,
                       start_timeout, exited, lost)
    grown_onto = _grown_onto(hosts, num_proc)
    if lost is not None and grown_onto and outcome.code != 0:
        outcome.message += (f" (the job had grown in place onto host(s) {', '.join(grown_onto)}: "
                            f"Open MPI 5.0's daemons can crash after that, in their direct modex "
                            f"handler; --transport tcp starts new processes without them)")
    outcome.transient_start_failure = (transient and code != 0 and not started
                                       and stop_signal is None)
    return outcome


def _cause(failures, raised, hosts=None):
    """The failed rank that started the job's end: the one whose failure
    came first, a rank's failure being when its program raised an
    exception of its own that it did not catch (which ends it with exit
    code 1, also when horarun stops it before it gets that far), or else
    when it ended. A rank that raises shuts hora down on its way out, and
    its peers may fail and exit before it does; the peers of a killed rank
    raise before its wrapper has seen it die. Their errors (a lost peer, a
    shutdown, a stall; reported as "peer") blame nobody, unless they name
    the rank that caused them ("peer=N": a rank lost or stopped), whose
    failure then dates from the first such error. None when no rank
    failed. A named rank whose end was never reported (a stopped process
    that the launcher killed with its wrapper) is blamed all the same."""
    if not failures:
        return None  # a process that raised did not end the job
    own = {rank: marker for rank, marker in raised.items()
           if not marker.outcome.startswith("peer")}
    when = {rank: marker.time for rank, marker in failures.items()}
    named = {}  # culprit -> the first "raised" marker naming it
    for marker in sorted(raised.values(), key=lambda m: m.time):
        kind, _, culprit = marker.outcome.partition("=")
        if kind == "peer" and culprit.isdigit():
            named.setdefault(int(culprit), marker)
            when[int(culprit)] = min(when.get(int(culprit), marker.time), marker.time)
    when.update({rank: min(marker.time, when.get(rank, marker.time))
                 for rank, marker in own.items()})
    rank = min(when, key=lambda r: (when[r], r))
    if rank in failures:
        return failures[rank]
    if rank in named:
        host = (hosts or {}).get(rank, "?")
        return markers.Marker("exited", rank, host, f"named={named[rank].rank}", when[rank])
    marker = own[rank]
    return markers.Marker("exited", rank, marker.host, "code=1", marker.time)


def _rank_list(ranks):
    if len(ranks) > 12:
        return ", ".join(map(str, ranks[:12])) + f" and {len(ranks) - 12} more"
    return ", ".join(map(str, ranks))


def _raised_its_own(rank, raised):
    """Whether ``rank`` failed with an exception of its own (not a peer's)."""
    marker = raised.get(rank)
    return marker is not None and not marker.outcome.startswith("peer")


def _grown_onto(hosts, num_proc):
    """Hosts that only processes started in place (ranks from ``num_proc``
    on) ran on: hosts mpirun added to the job as it grew."""
    launched = {host for rank, host in hosts.items() if rank < num_proc}
    return sorted({host for rank, host in hosts.items() if rank >= num_proc} - launched)


def _lost_ranks(lost, hosts, exited):
    """(host, its ranks that never reported an end) for the host whose
    daemon mpirun lost first, or None."""
    if lost is None:
        return None
    return lost, sorted(rank for rank, host in hosts.items()
                        if rank not in exited and hostlib.same_host(host, lost))


def _outcome(code, num_proc, started, first_failure, stop_signal, start_expired, start_timeout,
             exited=None, lost=None):
    started = frozenset(started)
    if stop_signal is not None:
        return Outcome(128 + stop_signal,
                       f"horarun: job stopped by {markers.signal_name(stop_signal)}",
                       started=started, stopped=True)
    if start_expired:
        return Outcome(code or 1, f"horarun: job stopped: not every rank started within "
                                  f"{start_timeout:g} s", started=started)
    if first_failure is not None:
        exit_code = first_failure.exit_code() or code or 1
        return Outcome(exit_code,
                       f"horarun: rank {first_failure.rank} on host {first_failure.host} failed "
                       f"first ({first_failure.describe()}); the job was stopped",
                       first_failure=first_failure, started=started)
    if code < 0:
        return Outcome(128 - code, f"horarun: mpirun was killed by {markers.signal_name(-code)}",
                       started=started)
    if lost is not None:
        host, ranks = lost
        if exited is not None and set(range(num_proc)) | started <= set(exited):
            # every rank and every process started in place had ended well
            # (first_failure is None) before mpirun lost that daemon: its
            # own shutdown, not the job (seen after a job grew onto a host
            # in place)
            return Outcome(0, f"horarun: every rank ended well; mpirun then lost its daemon on "
                              f"host {host} as it shut down", started=started)
        if not ranks:  # no rank had started there
            return Outcome(code or 1, f"horarun: mpirun lost its daemon on host {host} (the host "
                                      f"cannot be reached, or the daemon could not start or "
                                      f"run there); the job was stopped", started=started,
                           lost_host=host)
        return Outcome(code or 1, f"horarun: host {host} was lost (mpirun lost its daemon "
                                  f"there), and with it rank(s) {_rank_list(ranks)}; the job "
                                  f"was stopped", started=started, lost_host=host)
    missing = sorted(set(range(num_proc)) - set(exited if exited is not None else range(num_proc)))
    if code == 0 and missing:
        # mpirun can end "successfully" after losing a host whose daemon
        # and ranks were killed outright: their ends were never reported.
        return Outcome(1, f"horarun: mpirun ended, but rank(s) {_rank_list(missing)} never "
                          f"reported how they ended (was their host lost?); the job did not "
                          f"finish", started=started)
    if code != 0:
        return Outcome(code, f"horarun: job failed with exit code {code}", started=started)
    return Outcome(0, "", started=started)
