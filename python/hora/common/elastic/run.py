"""``hvd.elastic.run``: runs a training function so that it resumes from the
last commit whenever its world is (re)formed.

Under an elastic ``horarun`` (which sets ``HORA_ELASTIC_STATE_DIR``) a
world starts by loading the newest commit any host has on disk, or, on
the first launch, by syncing rank 0's state. A lost rank
(``HoraInternalError``) or a change of hosts (``HostsUpdatedInterrupt``)
ends the processes with :data:`RESET_EXIT_CODE` once the last commit is
on disk, and horarun launches the new world. Without an elastic horarun the
function runs once, after a sync, and those exceptions propagate.

In place (``horarun --elastic-in-place``, which sets
``HORA_ELASTIC_IN_PLACE=1``): after a lost rank the survivors keep their
processes, form a world of their own (``hora._C.reform``, ULFM), take the
state of the new rank 0 (so that a step some survivors finished and others
did not is redone alike), run the reset callbacks and call the function
again. Nothing since the last commit is lost. Where the MPI cannot re-form
in place, they leave for a relaunch as above. When horarun reports hosts
removed (or fewer slots) while ranks run there, those ranks leave at a
commit and end their processes, and the others form a world without them
(``hora._C.exclude``) and go on from that commit. They also start replacement
processes (:mod:`hora.common.elastic.growth`), which join at a later
``commit()`` and take the state from rank 0; more slots that horarun's
host discovery finds are filled the same way (other host changes still
end the processes for a relaunch).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable, NoReturn

from hora.common.elastic.buddy import BuddyCopies
from hora.common.elastic.growth import Growth, world_formed
from hora.common.elastic.notifications import HostUpdateListener
from hora.common.elastic.store import CommitStore
from hora.common.exceptions import HoraInternalError, HostsUpdatedInterrupt

# A rank that leaves so that horarun forms a new world exits with this;
# the runner imports it.
RESET_EXIT_CODE = 79
# How long a rank that left the job in place may take to end its process.
LEAVER_EXIT_GRACE_S = 30.0

_listener: HostUpdateListener | None = None


class _Job:
    """What horarun told this process about the elastic job."""

    def __init__(self, env: dict[str, str]):
        from hora.common.basics import local_rank
        directory = env.get("HORA_ELASTIC_STATE_DIR")
        # None: not supervised (not under an elastic horarun)
        self.store = CommitStore(directory, writer=local_rank() == 0) if directory else None
        self.restarts = int(env.get("HORA_ELASTIC_RESTARTS", "0") or 0)
        # horarun's address for host changes (rank 0 listens)
        self.supervisor = env.get("HORA_ELASTIC_SUPERVISOR")


def _listen(state: Any, job: _Job) -> None:
    """Rank 0 (of this world: one formed in place may have another) hears
    horarun's host changes for ``state``."""
    global _listener
    from hora.common.basics import rank
    if job.supervisor is None or rank() != 0:
        return
    if _listener is None:
        _listener = HostUpdateListener(job.supervisor, state)
    _listener.register(state)


def _restore_newest(state: Any, store: CommitStore) -> bool:
    """Collective: loads the newest commit any host has (the lowest rank
    holding it broadcasts it). False when there is none."""
    from hora.common.basics import rank
    from hora.common.ops import allgather_object, broadcast_object
    commits = allgather_object(store.newest(), name="hora.elastic.commits")
    newest = max(commits)
    if newest == 0:
        return False
    source = commits.index(newest)
    snapshot = store.load()[1] if rank() == source else None
    snapshot = broadcast_object(snapshot, root_rank=source, name="hora.elastic.snapshot")
    state.load_snapshot(snapshot)
    needed = state.parts_needed()
    if needed:
        state.load_parts(_gather_parts(store, newest, needed))
    state._commits = newest
    state.restore()
    return True


def _gather_parts(store: CommitStore, commit: int, needed: int) -> list[Any]:
    """Collective: the ``needed`` ranks' parts of commit ``commit``, each
    read by the lowest rank that has it on its host's disk and broadcast
    to every rank (so every rank briefly holds all of them)."""
    from hora.common.basics import rank
    from hora.common.ops import allgather_object, broadcast_object
    mine = [k for k in range(needed) if store.part_commit(k) == commit]
    everyone = allgather_object(mine, name="hora.elastic.parts")
    parts = []
    for k in range(needed):
        holders = [r for r, held in enumerate(everyone) if k in held]
        if not holders:
            raise RuntimeError(
                f"hora.elastic: commit {commit} was made by {needed} ranks, but the part of rank "
                f"{k} (its shard of the sharded optimizer state) is on no surviving host; hora "
                f"keeps no second copy of a shard, so this commit cannot be restored")
        part = store.load_part(k) if rank() == holders[0] else None
        parts.append(broadcast_object(part, root_rank=holders[0], name=f"hora.elastic.part.{k}"))
    return parts


def _end_within(seconds: float, me: int) -> None:
    """A process that left the job ends even if something keeps it from
    exiting (a thread of the program that is not a daemon, an exit handler
    that waits): the launcher would wait for it until the job's end."""
    import threading

    def end() -> None:
        print(f"hora.elastic: rank {me} left the job {seconds:g} s ago and its process has not "
              f"ended (a thread or an exit handler of the program holds it); ending it now",
              file=sys.stderr, flush=True)
        os._exit(0)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()


def _leave(state: Any, store: CommitStore, why: str) -> NoReturn:
    """Ends this process so that horarun forms the next world, once the last
    commit is on this host's disk."""
    from hora.common.basics import rank
    try:
        store.flush()
    finally:
        if rank() == 0:
            print(f"hora.elastic: {why}; leaving for a new world from commit {state._commits}",
                  file=sys.stderr, flush=True)
        raise SystemExit(RESET_EXIT_CODE)


def _reform_in_place(state: Any, store: CommitStore, error: BaseException,
                     growth: Growth) -> None:
    """The survivors' new world, in place; leaves for a relaunch when the
    MPI cannot form one."""
    from hora import _C
    from hora.common.basics import local_rank, rank, size
    from hora.common.exceptions import HoraError
    if state.holds_shards() and state._buddies is None:
        _leave(state, store, f"a rank was lost ({error}) with its shard of the training state "
                             f"(held by a process set of its own or hybrid: not cut again in "
                             f"place)")
    try:
        seconds = _C.reform()
    except HoraError as failed:
        _leave(state, store, f"a rank was lost ({error}), and the survivors cannot go on in "
                             f"place ({failed})")
    growth.abandoned()  # a spawn under way went with the old world
    world_formed()
    store.writer = local_rank() == 0
    state.drop_step_in_flight()
    if state._buddies is not None:
        # The lost ranks' shards since the last commit are gone: the world
        # goes back to the newest commit it holds whole (the buddy copies)
        # and cuts it for its new size. The reset callbacks run after, as
        # after a relaunch, and what they change is kept.
        restored, label = _restore_shards(state, store, joining=growth.joining)
        if not growth.joining:  # (a process that was joining runs none)
            state.on_reset()
        _settle(state, store, label)
        what = f"back to commit {restored}, its shards cut again for {size()} rank(s)"
    else:
        # Every survivor takes the new rank 0's state as it is now (not as
        # last committed): a step that some finished and others did not is
        # redone alike, and nothing since the last commit is lost. The
        # reset callbacks run first, as in Horovod, and what they change is
        # kept too.
        state.on_reset()
        state.save()
        state.sync()
        what = "nothing lost"
    if rank() == 0:
        print(f"hora.elastic: a rank was lost ({error}); {size()} rank(s) go on in place (world "
              f"re-formed in {seconds * 1000:.0f} ms; {what})", file=sys.stderr, flush=True)
    growth.replace_lost()


def _restore_shards(state: Any, store: CommitStore, joining: bool) -> tuple[int, int]:
    """Collective, in a world formed in place with state held in shards:
    every rank takes the newest commit the world holds whole (its parts
    from their holders, the rest from a rank that saved it; see
    :mod:`hora.common.elastic.buddy`), cut for this world. A process that
    joins holds nothing yet. Returns that commit's number, and the number
    the world commits it again under (newer than any commit a rank made,
    so that none made before, abandoned or on disk, is taken for it)."""
    from hora.common.basics import rank
    from hora.common.elastic.buddy import choose
    from hora.common.ops import allgather_object, broadcast_object
    buddies = state._buddies
    reports = allgather_object((-1 if joining else state._commits, buddies.inventory()),
                               name="hora.elastic.buddies")
    choice = choose(reports)
    if choice is None:
        _leave(state, store, "no commit is held whole by the ranks left (a rank and the next "
                             "one, which held the copy of its shard, were both lost)")
    commit, parts, holders, source = choice
    buddies.forget_after(commit)
    snapshot = state.snapshot() if rank() == source else None
    snapshot = broadcast_object(snapshot, root_rank=source, name="hora.elastic.snapshot")
    state.load_snapshot(snapshot)
    state.load_parts([broadcast_object(buddies.load((commit, parts, k)) if rank() == holder
                                       else None, root_rank=holder,
                                       name=f"hora.elastic.buddy.part.{k}")
                      for k, holder in enumerate(holders)])
    state._commits = commit
    state.recut()
    state.restore()
    return commit, max(saved for saved, _ in reports) + 1


def _recommit(state: Any, store: CommitStore, label: int, to_disk: bool = True) -> None:
    """Collective: the state as it is now becomes commit number ``label``,
    its parts copied to the neighbouring ranks of this world, and (with
    ``to_disk``) written to the hosts' disks as any commit."""
    from hora.common.basics import rank
    part = state.take_part()
    if part is not None:
        state._buddies.exchange(label, part)
    state.save()
    state._commits = label
    if to_disk:
        if store.writer:
            store.write(label, state.snapshot())
        if part is not None:
            store.write_part(label, rank(), part)


def _settle(state: Any, store: CommitStore, label: int) -> None:
    """Collective, after :func:`_restore_shards` and the reset callbacks
    (on the ranks that run them): rank 0's state as the callbacks left it
    everywhere, committed again as ``label``."""
    state.save()  # what the callbacks changed, which sync then spreads
    state.sync_replicated()
    _recommit(state, store, label)


def _resume_changed_world(state: Any, store: CommitStore) -> None:
    """Collective, in a world formed in place at a commit (grown, or left
    by ranks whose slots went), nobody lost: its state. With state held in
    shards, the last commit (the one just made) cut again for this world;
    new processes take part, run no reset callbacks and get rank 0's state
    as the callbacks left it. Otherwise as in Horovod: the reset
    callbacks, then rank 0's state everywhere (what the callbacks changed
    included; new processes run none: they start in this world)."""
    from hora.common.basics import local_rank
    store.writer = local_rank() == 0
    if state._buddies is not None:
        _, label = _restore_shards(state, store, joining=False)
        state.on_reset()
        _settle(state, store, label)
    else:
        state.on_reset()
        state.save()
        state.sync()


def _grow_in_place(state: Any, store: CommitStore, growth: Growth) -> None:
    """At a commit, with the replacements ready (or failed to start): the
    world of the ranks and the replacements, which take rank 0's state."""
    from hora.common.basics import rank, size
    state._growth_found = None
    new, before = growth.in_flight_new, size()
    seconds = growth.grow()  # a failed start fails here too, alike everywhere
    if seconds is None:
        growth.replace_lost()  # tried again, a few times
        return
    _resume_changed_world(state, store)
    growth.share(state)
    if rank() == 0:
        which = ("replacement" if new == 0 else "new" if new == size() - before
                 else "new and replacement")
        print(f"hora.elastic: {which} process(es) joined; {size()} ranks go on in place "
              f"(world re-formed in {seconds * 1000:.0f} ms)", file=sys.stderr, flush=True)
    growth.replace_lost()  # what a growth under way did not cover


def leavers(hosts: list[str], shrink: dict[str, Any]) -> list[int]:
    """The ranks (of a world whose ranks report the host names ``hosts``,
    in rank order) that leave for ``shrink`` (see
    :func:`hora.common.elastic.notifications.parse_update`): on each host
    with fewer slots, those beyond its slots, the lowest ranks staying."""
    from hora.runner.hosts import same_host
    leaving: list[int] = []
    for _, slots, reported in shrink["hosts"]:
        names = reported.split("|")
        here = [r for r, host in enumerate(hosts) if any(same_host(n, host) for n in names)]
        leaving += here[slots:]
    return sorted(set(leaving))


def _depart_in_place(state: Any, store: CommitStore, growth: Growth) -> None:
    """At a commit, with hosts of the job removed (or fewer slots on them)
    while ranks run there: those ranks leave the job and end their
    process; the others form a world of their own in place (no rank is
    lost: nothing to detect, nothing to redo) and go on, as Horovod's
    workers do when the driver removes a host."""
    from hora import _C
    from hora.common.basics import rank, size
    from hora.common.ops import allgather_object
    from hora.runner.rank_exec import host_name
    from hora.common.exceptions import HoraError
    # (kept until the world without the leavers is formed: a rank lost
    # before that re-forms the world, and the departure is made in it)
    departure, state._growth_found = state._departure, None
    shrink = departure["shrink"]
    hosts = allgather_object(host_name(), name="hora.elastic.hosts")
    leaving = leavers(hosts, shrink)
    before, me = size(), rank()
    if len(leaving) == before:
        _leave(state, store, "every host of the world was removed")
    if leaving and state.holds_shards() and state._buddies is None:
        _leave(state, store, f"rank(s) {', '.join(map(str, leaving))} leave with their shards "
                             f"of the training state (held by a process set of its own or "
                             f"hybrid: not cut again in place)")
    if _C.growth_state() != "none":
        # processes starting for the old world may be bound for a host that
        # went: started again below, for the world that is left
        _C.cancel_growth()
        growth.abandoned()
    if leaving:
        if state._buddies is not None:
            # the leavers' parts of the commit just made go to ranks that stay
            state._buddies.hand_over(leaving)
        try:
            left, seconds = _C.exclude(leaving)
        except HoraError as error:  # the engine is gone: no re-forming in place
            _leave(state, store, f"rank(s) {', '.join(map(str, leaving))} were to leave, and the "
                                 f"others could not form a world without them ({error})")
        state._departure = None
        if left:
            store.flush()
            print(f"hora.elastic: rank {me} leaves the job (its host {hosts[me]} was removed "
                  f"or has fewer slots); the others go on in place", file=sys.stderr, flush=True)
            _end_within(LEAVER_EXIT_GRACE_S, me)
            raise SystemExit(0)
        world_formed()
        state.drop_step_in_flight()  # (none at a commit; a check made elsewhere may have one)
        _resume_changed_world(state, store)
        if rank() == 0:
            print(f"hora.elastic: rank(s) {', '.join(map(str, leaving))} left the job (their "
                  f"hosts were removed or have fewer slots); {size()} rank(s) go on in place "
                  f"(world re-formed in {seconds * 1000:.0f} ms)", file=sys.stderr, flush=True)
    state._departure = None
    # what else horarun reported since the last check, in the order heard;
    # the processes they need are started once the size to come back to is
    # known (a growth heard before the removal was measured with it)
    if not shrink["last"]:
        growth.departed(shrink)
    state._act_on_sizes(departure["grow"], departure["lower"], start=False)
    if shrink["last"]:
        growth.departed(shrink)
    growth.replace_lost()


def _departure_pending(state: Any) -> bool:
    """Collective, in a world re-formed after a loss: whether ranks were to
    leave when it came (a loss in the middle of the check that heard of it
    can leave that known to some ranks only: rank 0's view counts; if it
    did not hear, it hears again, and the next commit acts)."""
    from hora.common.ops import broadcast_object
    state._departure = broadcast_object(state._departure, root_rank=0,
                                        name="hora.elastic.departure")
    if state._departure is None and state._growth_found == "depart":
        state._growth_found = None
    return state._departure is not None


def _join(state: Any, store: CommitStore, growth: Growth) -> None:
    """A replacement's start: its hora.init() learnt its place in the world;
    it joins now, at the world's next commit, and takes rank 0's state (as
    the ranks' _grow_in_place sends it)."""
    from hora import _C
    from hora.common.basics import _leave_if_not_needed, local_rank
    from hora.common.exceptions import HoraShutdownError
    if _C.joining():
        try:
            _C.join_world()
        except HoraShutdownError as error:  # the world finished first
            _leave_if_not_needed(error)
            raise
        world_formed()  # as the world does in Growth.grow
    store.writer = local_rank() == 0
    if state._buddies is not None:
        _, label = _restore_shards(state, store, joining=True)
        _settle(state, store, label)
    else:
        state.sync()
    growth.share(state)
    growth.replace_lost()  # collective, as the ranks' _grow_in_place ends


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorates ``func(state, ...)``, Horovod's ``hvd.elastic.run``."""
    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        job = _Job(dict(os.environ))
        _listen(state, job)
        store = job.store
        if store is None:
            state.sync()
            return func(state, *args, **kwargs)
        state._store = store
        growth = Growth(dict(os.environ))
        in_place = os.environ.get("HORA_ELASTIC_IN_PLACE") == "1"
        if in_place and state.recuts_in_place():
            state._buddies = BuddyCopies()
        if not growth.joining:
            if not _restore_newest(state, store):
                state.sync()
            if job.restarts > 0:
                state.on_reset()
            if state._buddies is not None:
                # the start is a commit the world holds whole (on disk already)
                _recommit(state, store, state._commits, to_disk=False)
        if in_place:
            state._growth_check = growth.ready
            state._growth_lower = growth.lower
            state._departs_in_place = True
            # else new slots mean a relaunch: so do they for state held in
            # shards that is not cut again in place (a process set's own,
            # or hybrid), which a new world re-cuts from the commit's parts
            if growth.can_start() and not (state.holds_shards() and state._buddies is None):
                state._growth_expand = growth.expand
        # what interrupted the last call: a lost rank (to re-form over the
        # survivors) or replacements ready to join (or, in a replacement,
        # its joining); a loss while that is dealt with (a second loss, a
        # replacement lost while it takes the state) is dealt with in turn
        interrupted: BaseException | str | None = "join" if growth.joining else None
        while True:
            try:
                if isinstance(interrupted, HoraInternalError):
                    _reform_in_place(state, store, interrupted, growth)
                    if _departure_pending(state):  # a loss interrupted it
                        _depart_in_place(state, store, growth)
                elif interrupted == "join":
                    _join(state, store, growth)
                elif interrupted is not None and state._growth_found == "depart":
                    _depart_in_place(state, store, growth)
                elif interrupted is not None:
                    _grow_in_place(state, store, growth)
                if interrupted is not None:
                    _listen(state, job)  # this world's rank 0 may be another
                interrupted = None
                result = func(state, *args, **kwargs)
                break
            except HoraInternalError as error:
                if not in_place:
                    _leave(state, store, f"a rank was lost ({error})")
                interrupted = error
            except HostsUpdatedInterrupt as update:
                if state._growth_found is None:
                    _leave(state, store, "the hosts changed")
                interrupted = update
        from hora.common.ops import barrier
        store.flush()
        barrier()  # every rank is done before the commit is forgotten
        store.clear()
        state._store = None
        state._buddies = None
        return result
    return wrapper
