"""horarun's elastic mode: launches the job, and when a rank is lost or the
hosts change, launches it again on what is there, up to ``--reset-limit``
times. The ranks resume from their last ``commit()``
(:mod:`hora.common.elastic`).

Why relaunch by default: MPI has no portable way to take a rank into, or
drop one from, a running job (ULFM is Open MPI only), while every MPI
launches a new job in a second or two. What survives the relaunch is the
committed state, which each host keeps on local disk, so even the loss of
every process loses at most the steps since the last commit. With
``--elastic-in-place`` (Open MPI 5) the ranks re-form and grow their world
themselves (:mod:`hora.common.elastic.run`); horarun then tells rank 0 of
new slots as growths, and relaunches only what cannot be done in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import random
import socket
import subprocess
import tempfile
import threading
import time
from typing import Callable

from hora.common.elastic.notifications import growth_line, lower_line, shrink_line
from hora.common.elastic.run import RESET_EXIT_CODE
from hora.runner import hosts as hostlib
from hora.runner.supervise import Outcome, live_ranks

# In place, how long a host gone from discovery may still hold live ranks
# (their ends may be on their way) before they are asked to leave.
LOST_HOST_GRACE_S = 2.0
# How often the discovery script is run while the job trains.
DISCOVERY_INTERVAL_S = 1.0
DISCOVERY_TIMEOUT_S = 30.0
# A host whose ranks fail this many launches in a row (each failing within
# HEALTHY_RUN_S of its start) is blacklisted: a crash now and then is the
# program's, a host that fails every time is the host's.
HOST_FAILURES_BEFORE_BLACKLIST = 3
HEALTHY_RUN_S = 60.0
# A program that fails the same way (the same exit code, soon after its
# start) in this many worlds in a row has a fault of its own (an
# ImportError, a typo) that no new world will fix.
SAME_FAILURES_BEFORE_STOP = 3
# Launches that fail before every rank has started (a host that does not
# resolve, ssh refused) are retried after a pause that doubles each time.
START_RETRY_FIRST_S = 0.5
START_RETRY_MAX_S = 30.0
LOCAL_NAMES = {"localhost", "127.0.0.1", socket.gethostname()}


@dataclasses.dataclass
class ElasticOptions:
    min_np: int
    max_np: int | None
    discovery_script: str | None
    slots_per_host: int | None
    reset_limit: int | None
    cooldown_range: tuple[float, float] | None
    elastic_timeout: float
    # where rank 0 reaches horarun when the job spans other hosts (default:
    # this host's name)
    supervisor_address: str | None = None
    # --elastic-in-place: survivors of a lost rank go on in their processes
    in_place: bool = False
    # and start replacements for the lost ranks (not with --no-replace)
    replace: bool = True


def state_directory(env: dict[str, str], command: list[str]) -> str:
    """Where each host keeps the committed state: HORA_ELASTIC_STATE_DIR if
    set, else a directory named after the working directory and the command,
    so that launching the same command again resumes the same training."""
    if env.get("HORA_ELASTIC_STATE_DIR"):
        return env["HORA_ELASTIC_STATE_DIR"]
    key = hashlib.sha256("\0".join([os.getcwd(), *command]).encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"hora-elastic-{os.geteuid()}", key)


class Discovery:
    """The hosts the job may use: the discovery script's, or a fixed list."""

    def __init__(self, script: str | None, slots_per_host: int | None,
                 fixed: list[hostlib.Host]):
        self.script = script
        self.slots_per_host = slots_per_host
        self.fixed = fixed
        self.last_error = ""

    def hosts(self) -> list[hostlib.Host] | None:
        """The current hosts, or None when the script failed (reason in
        ``last_error``)."""
        if self.script is None:
            return list(self.fixed)
        try:
            done = subprocess.run([self.script], capture_output=True, text=True,
                                  timeout=DISCOVERY_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            self.last_error = f"the host discovery script {self.script} failed: {error}"
            return None
        if done.returncode != 0:
            self.last_error = (f"the host discovery script {self.script} exited with "
                               f"{done.returncode}: {done.stderr.strip()[-500:]}")
            return None
        found = []
        for line in done.stdout.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, slots = line.partition(":")
            if not sep:
                slots = str(self.slots_per_host or 1)
            try:
                found.append(hostlib.parse_host_string(f"{name}:{slots}")[0])
            except hostlib.HostError as error:
                self.last_error = f"the host discovery script printed {line!r}: {error}"
                return None
        return found


class Blacklist:
    def __init__(self, cooldown_range: tuple[float, float] | None):
        self.cooldown_range = cooldown_range
        self.failures: dict[str, int] = {}
        self.until: dict[str, float] = {}

    def record(self, host: str, healthy: bool, log: Callable[[str], None]) -> None:
        """Counts a failed launch against ``host``; a failure after a long
        (healthy) run starts the count afresh."""
        self.failures[host] = 0 if healthy else self.failures.get(host, 0) + 1
        if self.failures[host] >= HOST_FAILURES_BEFORE_BLACKLIST:
            self.failures[host] = 0
            if self.cooldown_range is None:
                self.until[host] = float("inf")
                log(f"horarun: host {host} failed {HOST_FAILURES_BEFORE_BLACKLIST} launches in "
                    f"a row; it is not used again")
            else:
                cooldown = random.uniform(*self.cooldown_range)
                self.until[host] = time.monotonic() + cooldown
                log(f"horarun: host {host} failed {HOST_FAILURES_BEFORE_BLACKLIST} launches in "
                    f"a row; not used for the next {cooldown:.0f} s")

    def usable(self, found: list[hostlib.Host]) -> list[hostlib.Host]:
        now = time.monotonic()
        return [h for h in found if self.until.get(h.name, 0) <= now]

    def describe(self) -> str:
        now = time.monotonic()
        listed = sorted(name for name, until in self.until.items() if until > now)
        return f" (blacklisted: {', '.join(listed)})" if listed else ""


class Notifier:
    """Tells rank 0 that the hosts changed, over a TCP connection it opens
    to the address in HORA_ELASTIC_SUPERVISOR."""

    def __init__(self, bind_host: str):
        self._server = socket.create_server((bind_host, 0))
        self._clients: list[socket.socket] = []
        self._sent: bytes = b""  # what a late-connecting rank 0 must still hear
        self._last = 0.0  # the newest timestamp sent
        self._lock = threading.Lock()
        self.address = f"{bind_host}:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True, name="horarun-notifier").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                self._clients.append(client)
                if self._sent:
                    try:
                        client.sendall(self._sent)
                    except OSError:
                        self._clients.remove(client)

    def notify(self, growth: tuple[int, list[str], list[str]] | None = None,
               lower: tuple[int, list[str]] | None = None,
               shrink: tuple[int, list[tuple[str, int, str]]] | None = None) -> None:
        """The hosts changed: the world must be formed again, or, given
        ``growth`` (size, place, add: see hora.common.elastic.notifications),
        it may grow in place, or, given ``lower`` (size, removed hosts), it
        goes on smaller, or, given ``shrink`` (size, and each host with
        fewer slots: its name, the slots left, the name its ranks report),
        the ranks beyond those slots leave it."""
        with self._lock:
            # Ranks act on a message only when its timestamp is newer than
            # the last they acted on (as in Horovod), so each one is later
            # than the one before even where the wall clock was set back.
            now = self._last = max(time.time(), self._last + 1e-6)
            text = (growth_line(now, *growth) if growth else lower_line(now, *lower) if lower
                    else shrink_line(now, *shrink) if shrink else f"hosts-updated {now:.6f}\n")
            line = text.encode()
            self._sent += line
            for client in list(self._clients):
                try:
                    client.sendall(line)
                except OSError:
                    self._clients.remove(client)

    def close(self) -> None:
        self._server.close()
        with self._lock:
            for client in self._clients:
                client.close()
            self._clients.clear()


def _capacity(found: list[hostlib.Host], max_np: int | None) -> int:
    total = hostlib.total_slots(found)
    return min(total, max_np) if max_np else total


def _world(found: list[hostlib.Host], num_proc: int) -> list[hostlib.Host]:
    """The hosts a job of ``num_proc`` ranks fills, in order."""
    world, left = [], num_proc
    for host in found:
        if left <= 0:
            break
        world.append(hostlib.Host(host.name, min(host.slots, left)))
        left -= host.slots
    return world


def _only_adds(world: list[hostlib.Host], grown: list[hostlib.Host]) -> bool:
    """Whether ``grown`` is ``world`` with more slots and nothing less: every
    host of the world keeps at least its slots, and there are more."""
    slots = {h.name: h.slots for h in grown}
    return (hostlib.total_slots(grown) > hostlib.total_slots(world)
            and all(slots.get(h.name, 0) >= h.slots for h in world))


def _growth(world: list[hostlib.Host],
            grown: list[hostlib.Host]) -> tuple[int, list[str], list[str]]:
    """What rank 0 is told when ``world`` becomes ``grown`` in place: the
    size, where the new processes go (none for a job on this machine, whose
    processes MPI places itself) and the hosts new to the job."""
    size = hostlib.total_slots(grown)
    if all(h.name in LOCAL_NAMES for h in grown):
        return size, [], []
    before = {h.name: h.slots for h in world}
    place = [f"{h.name}:{h.slots - before.get(h.name, 0)}" for h in grown
             if h.slots > before.get(h.name, 0)]
    add = [h.name for h in grown if h.name not in before]
    return size, place, add


def _shrink(world: list[hostlib.Host], usable: list[hostlib.Host],
            live: dict[str, int]) -> dict[str, tuple[int, str, int]]:
    """The hosts of ``world`` that ``usable`` gives fewer slots (none for a
    host no longer listed), each with (the slots left, the names its ranks
    report, joined by "|", how many live ranks it holds: ``live`` counts
    them by the name they report)."""
    slots = {h.name: h.slots for h in usable}
    change = {}
    for host in world:
        left = slots.get(host.name, 0)
        if left >= host.slots:
            continue
        reported = [name for name in live if _names(host.name, name)]
        # (every name its ranks report: containers that share a listed
        # host may each report their own)
        change[host.name] = (left, "|".join(sorted(reported)) if reported else host.name,
                             sum(live[name] for name in reported))
    return change


def _names(listed: str, reported: str) -> bool:
    """Whether a rank reporting host ``reported`` runs on the host that
    discovery lists as ``listed`` (this machine's own name for a local one)."""
    if hostlib.same_host(listed, reported):
        return True
    return listed in LOCAL_NAMES and hostlib.same_host(reported, socket.gethostname())


def _describe(world: list[hostlib.Host]) -> str:
    return ", ".join(f"{h.name}:{h.slots}" for h in world)


class _Watcher:
    """While a job runs: runs discovery and notifies rank 0 once when the
    usable hosts would make a different world (more ranks, or a host of the
    job gone). In place, more slots on the same or new hosts are reported
    as a growth, each time they are found, and the watch goes on."""

    def __init__(self, discovery, blacklist, options, world, notifier, log):
        self._stop = threading.Event()
        self.changed = None
        # the last change that asked ranks to leave in place, and when
        self.departure: tuple[str, float] | None = None
        # the hosts of the job, those it grew onto in place included
        self.world = list(world)
        self._args = (discovery, blacklist, options, world, notifier, log)
        self._thread = threading.Thread(target=self._watch, daemon=True, name="horarun-discovery")
        self._thread.start()

    def _watch(self) -> None:
        discovery, blacklist, options, world, notifier, log = self._args
        size = hostlib.total_slots(world)
        names = {h.name for h in world}
        said = ""
        held_since = None  # when a removed host was first seen still holding live ranks
        while not self._stop.wait(DISCOVERY_INTERVAL_S):
            found = discovery.hosts()
            if found is None:
                if discovery.last_error != said:
                    said = discovery.last_error
                    log(f"horarun: {said}; the job goes on with its hosts")
                continue
            said = ""
            usable = blacklist.usable(found)
            gone = names - {h.name for h in usable}
            capacity = _capacity(usable, options.max_np)
            grown = _world(usable, capacity)
            if options.in_place and options.replace and _only_adds(world, grown):
                notifier.notify(_growth(world, grown))
                log(f"horarun: more slots found ({_describe(usable)}); {capacity - size} new "
                    f"process(es) join the world in place at a commit")
                world, size = grown, capacity
                names = {h.name for h in world}
                self.world = list(world)
                continue
            if options.in_place:
                change = _shrink(world, usable, live_ranks.by_host())
                kept = [hostlib.Host(h.name, change[h.name][0] if h.name in change else h.slots)
                        for h in world]
                kept = [h for h in kept if h.slots > 0]
                dying = any(left == 0 and held for left, _, held in change.values())
                if dying:
                    # A host removed whole while horarun still counts ranks
                    # there: they may have been lost with it, their ends on
                    # their way (the list can change first). If so, the
                    # others go on without them anyway; only ranks still
                    # alive after a while are asked to leave.
                    held_since = held_since or time.monotonic()
                    if time.monotonic() - held_since < LOST_HOST_GRACE_S:
                        continue
                held_since = None
                if change and hostlib.total_slots(kept) >= options.min_np:
                    # Fewer slots on hosts of the job, or hosts removed: the
                    # ranks beyond their slots leave at the next commit, and
                    # the others go on in place without them.
                    world, size = kept, hostlib.total_slots(kept)
                    names = {h.name for h in world}
                    self.world = list(world)
                    leave = any(held > kept_here for kept_here, _, held in change.values())
                    removed = sorted(name for name, (kept_here, _, _) in change.items()
                                     if kept_here == 0)
                    whole = len(removed) == len(change)
                    what = (f"host(s) {', '.join(removed)} removed" if whole else
                            f"fewer slots found ({_describe(usable)})")
                    nobody = ("no rank of the job is left there" if whole else
                              "no rank of the job runs beyond the slots left")
                    if leave:
                        self.departure = (what, time.monotonic())
                        notifier.notify(shrink=(size, [(name, kept_here, reported) for name, (
                            kept_here, reported, _) in sorted(change.items())]))
                        log(f"horarun: {what}; the ranks beyond the slots left there leave at the "
                            f"next commit, and {size} rank(s) go on in place")
                    elif options.replace:
                        # the ranks there were lost already: no process is
                        # started for them (until discovery lists slots again)
                        notifier.notify(lower=(size, removed))
                        log(f"horarun: {what}; {nobody}; the world comes back to {size} "
                            f"rank(s) at most")
                    else:
                        log(f"horarun: {what}; {nobody}")
                    continue
            if gone or capacity != size:
                self.changed = (f"host(s) {', '.join(sorted(gone))} removed" if gone
                                else f"{'more' if capacity > size else 'fewer'} slots found "
                                     f"({_describe(usable)})")
                log(f"horarun: {self.changed}; the ranks re-form the world at their next "
                    f"commit")
                notifier.notify()
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run(options: ElasticOptions, discovery: Discovery,
        launch: Callable[[int, list[hostlib.Host] | None, dict[str, str]], Outcome],
        env: dict[str, str], command: list[str], log: Callable[[str], None],
        first_np: int | None = None) -> int:
    """The elastic loop. ``launch(num_proc, hosts, extra_env)`` runs one job
    (hosts None: this machine) and returns its supervise.Outcome; the first
    world has at most ``first_np`` ranks (-np), later ones as many as the
    hosts hold, up to --max-np."""
    blacklist = Blacklist(options.cooldown_range)
    state_dir = state_directory(env, command)
    resets = 0
    same_failure, same_count = None, 0  # the last world's start-up failure, in a row
    start_retry = previous_retry = 0.0  # the pause before relaunching after a failed start
    while True:
        if start_retry:
            time.sleep(start_retry)
        found = _wait_for_capacity(options, discovery, blacklist, log)
        if found is None:
            return 1
        num_proc = _capacity(found, options.max_np)
        if resets == 0 and first_np is not None:
            num_proc = max(min(num_proc, first_np), options.min_np)
        world = _world(found, num_proc)
        if resets > 0:
            log(f"horarun: world {resets + 1}: {num_proc} rank(s) on {_describe(world)}")
        local = all(h.name in LOCAL_NAMES for h in world)
        notifier = Notifier("127.0.0.1" if local else "0.0.0.0")
        port = notifier.address.rsplit(":", 1)[1]
        address = notifier.address if local else \
            f"{options.supervisor_address or socket.gethostname()}:{port}"
        extra = {"HORA_ELASTIC_STATE_DIR": state_dir, "HORA_ELASTIC_RESTARTS": str(resets),
                 "HORA_ELASTIC_SUPERVISOR": address}
        if options.in_place:
            extra["HORA_ELASTIC_IN_PLACE"] = "1"
            if not options.replace:
                extra["HORA_ELASTIC_REPLACE"] = "0"
        watcher = _Watcher(discovery, blacklist, options, world, notifier, log)
        started = time.monotonic()
        try:
            outcome = launch(num_proc, None if local else world, extra)
        finally:
            watcher.stop()
            notifier.close()
        if outcome.code == 0:
            return 0
        if outcome.stopped:
            return outcome.code
        ran = time.monotonic() - started
        failure = outcome.first_failure
        not_started = sorted(set(range(num_proc)) - set(outcome.started))
        start_retry = 0.0
        backoff = min(START_RETRY_MAX_S, max(START_RETRY_FIRST_S, previous_retry * 2))
        if failure is not None and failure.outcome == f"code={RESET_EXIT_CODE}":
            why = "a peer was lost" if watcher.departure is None else (
                f"a peer was lost, or the ranks could not leave in place after "
                f"{watcher.departure[0]}, {time.monotonic() - watcher.departure[1]:.0f} s "
                f"before")
            cause = watcher.changed or (f"rank {failure.rank} on host {failure.host} left for a "
                                        f"new world ({why})")
            same_failure, same_count = None, 0
        else:
            cause = outcome.message.removeprefix("horarun: ") or f"exit code {outcome.code}"
            key = failure.outcome if failure is not None and ran <= HEALTHY_RUN_S else None
            if key is not None and key.startswith("code="):
                same_count = same_count + 1 if key == same_failure else 1
                same_failure = key
            else:
                same_failure, same_count = None, 0
            if same_count >= SAME_FAILURES_BEFORE_STOP:
                log(f"horarun: {cause}; the program failed the same way in {same_count} worlds "
                    f"in a row, each within {HEALTHY_RUN_S:g} s of its start: a fault of its "
                    f"own (its error is above) that a new world does not fix, so the job stops")
                return outcome.code or 1
            if outcome.lost_host is not None:
                # mpirun lost that host's daemon: the host's fault alone
                # (the others' ranks were stopped, or never started, on its
                # account).
                named = [h.name for h in world if hostlib.same_host(h.name, outcome.lost_host)]
                blacklist.record(named[0] if named else outcome.lost_host,
                                 ran > HEALTHY_RUN_S, log)
                if not_started:
                    start_retry = backoff
            elif failure is None and not_started:
                # mpirun failed before some ranks started: their hosts'
                # fault (as discovery names them), retried with a pause.
                hosts = sorted({_host_of(world, rank) for rank in not_started})
                cause += f" before rank(s) on {', '.join(hosts)} started"
                for host in hosts:
                    blacklist.record(host, False, log)
                start_retry = backoff
            elif failure is not None:
                blacklist.record(_host_of(world, failure.rank, failure.host, watcher.world),
                                 ran > HEALTHY_RUN_S, log)
        previous_retry = start_retry
        resets += 1
        if options.reset_limit is not None and resets > options.reset_limit:
            log(f"horarun: {cause}; the job has been reset {resets - 1} times "
                f"(--reset-limit {options.reset_limit}), so it stops here")
            return outcome.code or 1
        log(f"horarun: elastic reset {resets}: {cause}")


def _host_of(world: list[hostlib.Host], rank: int, reported: str | None = None,
             grown: list[hostlib.Host] | None = None) -> str:
    """The host (as discovery or -H names it) that process ``rank`` runs
    on: mpirun fills the launch's hosts in order. A process that a world
    started in place (an id past the launch's) ran where its wrapper
    ``reported``: matched among the hosts of the job (``grown``: with those
    it grew onto), this machine's own name being its local one."""
    for host in world:
        if rank < host.slots:
            return host.name
        rank -= host.slots
    hosts = grown or world
    if reported:
        # a name that matches first, then this machine's local one
        named = ([h.name for h in hosts if hostlib.same_host(h.name, reported)]
                 or [h.name for h in hosts if _names(h.name, reported)])
        return named[0] if named else reported
    return world[-1].name if world else "?"


def _wait_for_capacity(options: ElasticOptions, discovery: Discovery, blacklist: Blacklist,
                       log: Callable[[str], None]) -> list[hostlib.Host] | None:
    """The usable hosts once they hold at least --min-np slots; None (after
    saying why) when that does not happen within --elastic-timeout."""
    deadline = time.monotonic() + options.elastic_timeout
    waiting_said = False
    error_said = ""
    while True:
        found = discovery.hosts()
        if found is None and discovery.last_error != error_said:
            error_said = discovery.last_error
            log(f"horarun: {error_said}; trying again until --elastic-timeout "
                f"({options.elastic_timeout:g} s) runs out")
        usable = blacklist.usable(found) if found is not None else []
        if found is not None and hostlib.total_slots(usable) >= options.min_np:
            return usable
        if time.monotonic() >= deadline:
            why = discovery.last_error if found is None else (
                f"{hostlib.total_slots(usable)} slot(s) available{blacklist.describe()}")
            log(f"horarun: fewer than --min-np {options.min_np} slots for "
                f"{options.elastic_timeout:g} s (--elastic-timeout): {why}; stopping")
            return None
        if not waiting_said:
            waiting_said = True
            log(f"horarun: waiting for at least {options.min_np} slots "
                f"(up to {options.elastic_timeout:g} s)")
        time.sleep(DISCOVERY_INTERVAL_S)
