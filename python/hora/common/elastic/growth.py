"""Growing in place (``horarun --elastic-in-place``): after a lost rank
the survivors start replacement processes (MPI dynamic processes, through
``hora._C.start_growth``) and go on training while those start; once the
replacements are up, the next ``commit()`` takes them in. New slots that
host discovery finds are filled the same way: horarun reports them to
rank 0, the next ``commit()`` starts the processes (on the hosts horarun
named, adding hosts the job did not start with to the MPI job), and a
later one takes them in.

A replacement runs the command the ranks were launched with, under
horarun's rank wrapper, with the environment of the survivor that started
it (less what MPI and the wrapper give each process), and knows itself by
``HORA_ELASTIC_JOINER_ID``: its ``hora.init()`` learns the place it will
have in the survivors' world (as its last ranks) without joining it, and
its ``hvd.elastic.run`` joins, at the world's next commit, and takes the
state from rank 0 instead of from a commit.

Each process horarun started or a world started in its place has an id
for horarun's bookkeeping: the launch's ranks are 0..np-1, replacements
get np, np+1, ... in the order they are started.
"""

from __future__ import annotations

import json
import shutil
import sys
from typing import Any

# What MPI and horarun's rank wrapper give each process themselves.
_OWN_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_")
_OWN_NAMES = frozenset(
    f"{lead}_{name}" for lead in ("HORA", "HOROVOD")
    for name in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")) | {
        "HORA_RUNNER_REPORT_FD", "HORA_ELASTIC_JOINER_ID", "HORA_ELASTIC_JOINER_RANK",
        # horarun's own launch (--transport tcp) gives each process its own
        "HORA_LAUNCH_RANK", "HORA_LAUNCH_SIZE", "HORA_LAUNCH_LOCAL_RANK", "HORA_LAUNCH_LOCAL_SIZE",
        "HORA_PROCESS_ID", "HORA_RENDEZVOUS", "HORA_RENDEZVOUS_COOKIE"}
# A replacement that cannot start or join is tried again at most this many
# times in a row.
_MAX_FAILURES = 3
# How horarun's own launch (--transport tcp) refuses to start a process
# when the slots it would take went with a lost host: none is tried again
# until horarun reports slots (the host listed again, or others).
NO_SLOT = "no slot to start it in"


def world_formed() -> None:
    """Collective, on every rank of a world just formed in place (after a
    loss, a growth, or in a replacement that joined): what ``hora.init()``
    does after the engine starts, and the unnamed-collective counters from
    0 (the ranks may differ by the interrupted step, a replacement has made
    none)."""
    from hora.common._adapter.naming import restart_counters
    from hora.common.process_set_setup import setup_at_init
    restart_counters()
    setup_at_init([])


class Growth:
    """The survivors' side: which replacements to start, and when they are
    taken in. Every rank holds one and makes the same calls."""

    def __init__(self, env: dict[str, str]):
        self.enabled = (env.get("HORA_ELASTIC_IN_PLACE") == "1"
                        and env.get("HORA_ELASTIC_REPLACE", "1") != "0")
        launch = env.get("HORA_RANK_EXEC")
        self.launch: dict[str, Any] | None = json.loads(launch) if launch else None
        # the world size to come back to: the launch's, or what host
        # discovery found since (a replacement is told the same)
        self.target = int(env.get("HORA_SIZE", "0") or 0)
        # where the processes of a growth horarun reported go: host:count
        # entries, and hosts to add to the MPI job first (empty: where MPI
        # places them, as for replacements)
        self.place: list[str] = []
        self.add: list[str] = []
        # what the spawn under way took of them (given back if it fails)
        self.in_flight: tuple[list[str], list[str]] = ([], [])
        # the id the next replacement gets (made the same on every rank when
        # a world grows)
        self.next_id = self.target
        # of the processes still to start, how many fill new slots (the
        # others replace lost ranks), and how many the spawn under way does
        self.new_slots = 0
        self.in_flight_new = 0
        self.failures = 0
        self.env = env
        # a replacement that has not yet taken the state
        self.joining = "HORA_ELASTIC_JOINER_ID" in env

    def can_start(self) -> bool:
        """Whether this world starts processes (replacements, new slots'):
        in place, replacing, started by horarun's rank wrapper."""
        return self.enabled and self.launch is not None

    def expand(self, update: dict[str, Any], start: bool = True) -> None:
        """Collective, at a commit: horarun found more slots (``update`` from
        :func:`hora.common.elastic.notifications.parse_update`); starts the
        processes that fill them (with ``start``; else the caller does)."""
        from hora.common.basics import rank
        self.place += update["place"]
        self.add += update["add"]
        self.failures = 0
        if update["grow"] > self.target:
            self.new_slots += update["grow"] - self.target
            self.target = update["grow"]
            if rank() == 0:
                print(f"hora.elastic: more slots found; the world grows to {self.target} ranks "
                      f"in place", file=sys.stderr, flush=True)
        elif not update["place"]:
            return
        # (else slots came back where lost ranks were, a host lost whole
        # listed again: the replacements still to start go there)
        if start:
            self.replace_lost()

    def lower(self, update: dict[str, Any]) -> None:
        """Collective, at a commit: horarun reports hosts gone whose ranks
        were all lost (``update`` from
        :func:`hora.common.elastic.notifications.parse_update`): the world
        comes back to ``update["lower"]`` ranks at most, and nothing is
        placed on those hosts."""
        from hora.common.basics import rank
        removed = set(update["removed"])
        if self._lower_to(update["lower"], removed) and rank() == 0:
            what = (f"host(s) {', '.join(sorted(removed))} left with their ranks" if removed
                    else "fewer slots found, where ranks were lost")
            print(f"hora.elastic: {what}; the world comes back to {self.target} rank(s) at most",
                  file=sys.stderr, flush=True)

    def _lower_to(self, target: int, removed: set[str]) -> bool:
        """Places nothing on the hosts ``removed``, and comes back to
        ``target`` ranks at most; whether that lowered the target."""
        from hora.common.basics import size
        self.place = [entry for entry in self.place if entry.rpartition(":")[0] not in removed]
        self.add = [host for host in self.add if host not in removed]
        if target >= self.target:
            return False
        self.target = target
        self.new_slots = min(self.new_slots, max(0, self.target - size()))
        return True

    def departed(self, update: dict[str, Any]) -> None:
        """Collective, in the world formed in place after ranks left
        (``update`` from :func:`hora.common.elastic.notifications.parse_update`:
        fewer slots on its hosts): nothing more is placed where slots went,
        and the world comes back to ``update["shrink"]`` ranks at most."""
        self._lower_to(update["shrink"], {name for name, slots, _ in update["hosts"] if not slots})
        # a place on a host with fewer slots may be one it no longer has
        fewer = {name for name, slots, _ in update["hosts"] if slots}
        self.place = [entry for entry in self.place if entry.rpartition(":")[0] not in fewer]

    def abandoned(self) -> None:
        """After a loss ended the spawn under way (``hora._C.reform``): its
        places are to be filled again."""
        self._give_back()

    def _give_back(self) -> None:
        place, add = self.in_flight
        self.place, self.add = place + self.place, add + self.add
        self.in_flight = ([], [])
        self.new_slots += self.in_flight_new
        self.in_flight_new = 0

    def _placed(self, missing: int) -> tuple[int, list[tuple[str, str]]]:
        """How many of ``missing`` processes to start now, and the spawn's
        MPI info (Open MPI's keys). They go where horarun said, all of
        them, or where mpirun puts them (one spawn places all its processes
        one way). Open MPI refuses to start one on a host whose slots the
        launch filled with ranks bound a core each, so the new ones may
        oversubscribe and are not bound (Horovod binds nothing either)."""
        info = [("map_by", ":OVERSUBSCRIBE"), ("bind_to", "none")]
        placed = sum(int(entry.rpartition(":")[2]) for entry in self.place)
        if not placed:
            return missing, info
        info.append(("host", ",".join(self.place)))
        if self.add:  # Open MPI 5 calls "add-host" by PMIx's name
            info.append(("PMIX_ADD_HOST", ",".join(self.add)))
        self.in_flight, self.place, self.add = (self.place, self.add), [], []
        return min(missing, placed), info

    def replace_lost(self) -> None:
        """Collective: starts processes up to the world size to come back to
        (in the background; the ranks go on training). Nothing while some
        are starting already: the commit that takes those in calls it
        again."""
        from hora import _C
        from hora.common.basics import rank, size
        missing = self.target - size()
        if not self.enabled or missing <= 0 or self.failures >= _MAX_FAILURES:
            return
        if _C.growth_state() != "none":
            return
        if self.launch is None:
            if rank() == 0:
                print("hora.elastic: not replacing the lost rank(s): the ranks were not started "
                      "by horarun's rank wrapper", file=sys.stderr, flush=True)
            return
        env = {k: v for k, v in self.env.items()
               if not k.startswith(_OWN_PREFIXES) and k not in _OWN_NAMES}
        count, info = self._placed(missing)
        new = min(count, self.new_slots)
        self.new_slots -= new
        self.in_flight_new = new
        env["HORA_ELASTIC_JOINER_ID"] = str(self.next_id)
        env["HORA_ELASTIC_JOINER_NEW"] = str(new)  # the last ones started
        env["HORA_ELASTIC_JOINER_RANK"] = str(size())
        # the wrapper's rank variables say the size of the world they join
        env["HORA_ELASTIC_TARGET_SIZE"] = str(size() + count)
        argv = [shutil.which("env") or "/usr/bin/env", *(f"{k}={v}" for k, v in env.items()),
                self.launch["python"], "-m", "hora.runner.rank_exec", *self.launch["argv"]]
        _C.start_growth(argv, count, info)
        self.next_id += count
        if rank() == 0:
            where = "".join(f" on {value}" for key, value in info if key == "host")
            print(f"hora.elastic: starting {_processes(count, new)}{where}",
                  file=sys.stderr, flush=True)

    @staticmethod
    def ready() -> str | None:
        """Rank 0, at a commit: 'ready' when the replacements wait to join
        (they reached ``hvd.elastic.run``), 'failed' when they could not
        start (grow() then says why), else None."""
        from hora import _C
        state = _C.growth_state()
        return state if state in ("ready", "failed") else None

    def grow(self) -> float | None:
        """Collective over the ranks and the replacements (the latter in
        their ``hvd.elastic.run``): forms the world of both. The seconds it
        took, or None when a replacement was lost on the way (the world
        stays as it was)."""
        from hora import _C
        from hora.common.basics import rank
        from hora.common.exceptions import HoraError
        try:
            seconds = _C.grow()
        except HoraError as error:
            self.failures += 1
            self._give_back()
            waiting = ""
            if NO_SLOT in str(error):
                self.failures = _MAX_FAILURES  # until horarun reports slots
                waiting = "; none is started until host discovery lists slots for them"
            if rank() == 0:
                print(f"hora.elastic: the replacement(s) did not join ({error}){waiting}",
                      file=sys.stderr, flush=True)
            return None
        self.failures = 0
        self.in_flight = ([], [])  # placed, and the hosts are the job's now
        self.in_flight_new = 0
        world_formed()
        return seconds

    def share(self, state: Any) -> None:
        """Collective, right after a world grew: the ids, the commit count,
        the size to come back to, the places still to fill and the last
        host change heard become rank 0's (a replacement knows none of them
        for sure)."""
        from hora.common.ops import broadcast_object
        (self.next_id, state._commits, self.target, self.place, self.add, self.new_slots,
         state._last_updated_timestamp) = broadcast_object(
            (self.next_id, state._commits, self.target, self.place, self.add, self.new_slots,
             state._last_updated_timestamp), root_rank=0, name="hora.elastic.grown")
        self.joining = False


def _processes(count: int, new: int) -> str:
    """'2 replacement process(es)', '1 new process(es)', or both."""
    if new == 0:
        return f"{count} replacement process(es)"
    if new == count:
        return f"{count} new process(es)"
    return f"{count} process(es) ({count - new} replacement(s), {new} new)"
