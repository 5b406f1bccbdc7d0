"""State that survives a change of world: Horovod's ``State`` and
``ObjectState``, with the committed copy also kept on disk so that it
outlives the processes (see :mod:`hora.common.elastic.store`)."""

from __future__ import annotations

import copy
import queue
from typing import TYPE_CHECKING, Any, Callable

from hora.common.elastic.buddy import BuddyCopies
from hora.common.elastic.store import CommitStore
from hora.common.exceptions import HostsUpdatedInterrupt


def _broadcast_object(obj: Any, root_rank: int = 0) -> Any:
    from hora.common.ops import broadcast_object
    return broadcast_object(obj, root_rank)


def _rank() -> int:
    from hora.common.basics import rank
    return rank()


class State:
    """What a training loop must keep across a change of world: saved on
    ``commit()``, put back by ``restore()``, made the same on every rank by
    ``sync()``. Subclasses implement those three (as in Horovod), and
    ``snapshot()`` / ``load_snapshot()`` for the copy kept on disk.

    Args:
        bcast_object: broadcasts a picklable object from a root rank
            (default: ``hora.broadcast_object``).
        get_rank: this process's rank (default: ``hora.rank``).
    """

    def __init__(self, bcast_object: Callable[..., Any] | None = None,
                 get_rank: Callable[[], int] | None = None):
        self._bcast_object = bcast_object or _broadcast_object
        self._rank = get_rank or _rank
        self._host_messages: queue.Queue = queue.Queue()
        self._heard: list[tuple[float, Any]] = []
        self._last_updated_timestamp = 0.0
        self._reset_callbacks: list[Callable[[], Any]] = []
        self._commits = 0       # commits so far, counted across relaunches
        # set by hora's run() under an elastic horarun
        self._store: CommitStore | None = None
        # set by hora's run() in place: rank 0's view of replacement
        # processes ('ready', 'failed' or None), and what the last check
        # found, for run() to act on; and what starts the processes of a
        # growth horarun reports (more slots found)
        self._growth_check: Callable[[], str | None] | None = None
        self._growth_found: str | None = None
        self._growth_expand: Callable[[dict[str, Any], bool], None] | None = None
        # and hosts horarun reports gone with their ranks (the world comes
        # back to fewer ranks)
        self._growth_lower: Callable[[dict[str, Any]], None] | None = None
        # and whether ranks can leave in place (fewer slots, or hosts
        # removed, where ranks still run), and what run() then acts on
        self._departs_in_place = False
        self._departure: dict[str, Any] | None = None
        # set by hora's run() in place for state held in shards that can be
        # cut again in place: the parts' copies on the neighbouring ranks
        self._buddies: BuddyCopies | None = None

    def register_reset_callbacks(self, callbacks: list[Callable[[], Any]]) -> None:
        """Functions to call after the world changed (ranks lost or added),
        for instance to rescale the learning rate to the new ``size()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Calls :meth:`reset`, then the reset callbacks (``hvd.elastic.run``
        calls it in every world after the first). Unlike Horovod's, it keeps
        the host changes heard and not yet acted on: a world re-formed in
        place has not seen them (those already acted on are older than the
        last check's)."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """Resets objects and variables after the world changed, before the
        state is synced (Horovod's hook for subclasses; does nothing)."""

    def on_hosts_updated(self, timestamp: float, update_result: Any = None) -> None:
        """Called (on rank 0) when horarun reports a change of hosts;
        ``update_result`` describes a growth the world can take in place
        (see :mod:`hora.common.elastic.notifications`), or is None."""
        self._host_messages.put((timestamp, update_result))

    def commit(self) -> None:
        """Saves the state, as the point training resumes from if a rank is
        lost, and checks for host changes (raising ``HostsUpdatedInterrupt``
        on every rank when there are). Under an elastic ``horarun`` the
        committed state is also written to this host's disk, in the
        background."""
        part = None
        if self._buddies is not None:
            # the shards' parts first: see hora.common.elastic.buddy
            part = self.take_part()
            if part is not None:
                self._buddies.exchange(self._commits + 1, part)
        self.save()
        self._commits += 1
        if self._store is not None:
            if self._store.writer:
                self._store.write(self._commits, self.snapshot())
            if part is None:
                part = self.snapshot_part()
            if part is not None:
                self._store.write_part(self._commits, self._rank(), part)
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises ``HostsUpdatedInterrupt`` on every rank at once when horarun
        has reported a change of hosts since the last check (or, in place,
        when replacements for lost ranks or new processes are ready to
        join). In place, more slots found start new processes here, and
        training goes on while they start."""
        newest = previous = self._last_updated_timestamp
        relaunch = False
        grow: dict[str, Any] | None = None
        lower: dict[str, Any] | None = None
        shrink: dict[str, Any] | None = None
        # kept until every rank acted on them: a loss during the broadcast
        # below leaves them for the next check, in the next world
        while not self._host_messages.empty():
            self._heard.append(self._host_messages.get())
        for timestamp, update in self._heard:
            if timestamp <= previous:  # heard before, by an earlier rank 0
                continue
            newest = max(newest, timestamp)
            if isinstance(update, dict) and "grow" in update:
                grow = update if grow is None else {  # two since the last check
                    "grow": update["grow"], "place": grow["place"] + update["place"],
                    "add": grow["add"] + update["add"]}
                for later in (lower, shrink):
                    if later is not None:
                        later["last"] = False
            elif isinstance(update, dict) and "lower" in update:
                removed = (lower["removed"] if lower else []) + update["removed"]
                lower = {"lower": update["lower"], "removed": removed, "last": True}
            elif isinstance(update, dict) and "shrink" in update:
                hosts = {name: entry for name, *entry in (shrink or {}).get("hosts", [])}
                hosts.update({name: entry for name, *entry in update["hosts"]})
                shrink = {"shrink": update["shrink"], "last": True,
                          "hosts": [(name, *entry) for name, entry in hosts.items()]}
            else:
                relaunch = True
        growth = None
        if self._growth_check is not None and self._rank() == 0:
            growth = self._growth_check()
        # rank 0 hears from horarun; everyone must act at the same point
        self._last_updated_timestamp, growth, relaunch, grow, lower, shrink = self._bcast_object(
            (newest, growth, relaunch, grow, lower, shrink))
        self._heard.clear()
        if (relaunch or (grow is not None and self._growth_expand is None)
                or (shrink is not None and not self._departs_in_place)):
            raise HostsUpdatedInterrupt(False)
        if shrink is not None:
            # ranks leave: the world is formed again first (hora's run()
            # does it), then the rest is acted on there
            self._departure = {"shrink": shrink, "grow": grow, "lower": lower}
            self._growth_found = "depart"
            raise HostsUpdatedInterrupt(False)
        self._act_on_sizes(grow, lower)
        if growth is not None:
            self._growth_found = growth
            raise HostsUpdatedInterrupt(False)

    def _act_on_sizes(self, grow: dict[str, Any] | None, lower: dict[str, Any] | None,
                      start: bool = True) -> None:
        """Collective: more slots found, and hosts left with their ranks, in
        the order heard (a growth heard last was measured without the hosts
        removed before it); without ``start`` a growth starts no process
        yet."""
        lowering = self._growth_lower
        if lower is not None and lowering is not None and not lower["last"]:
            lowering(lower)
        if grow is not None and self._growth_expand is not None:
            self._growth_expand(grow, start)
        if lower is not None and lowering is not None and lower["last"]:
            lowering(lower)

    def save(self) -> None:
        """Keeps a copy of the state as the last committed one."""
        raise NotImplementedError

    def restore(self) -> None:
        """Puts the last committed state back, undoing later changes."""
        raise NotImplementedError

    def sync(self) -> None:
        """Makes every rank's state rank 0's."""
        raise NotImplementedError

    def snapshot(self) -> Any:
        """The last committed state as one picklable object, for the copy
        kept on disk. ``State`` subclasses of one's own implement it (and
        ``load_snapshot``) to survive the loss of every process."""
        raise NotImplementedError(
            f"{type(self).__name__} does not implement snapshot()/load_snapshot(), which hora "
            f"needs to keep the committed state across a relaunch; use ObjectState or a "
            f"framework's state class, or implement both")

    def load_snapshot(self, snapshot: Any) -> None:
        """Makes ``snapshot`` (from :meth:`snapshot`) the last committed state;
        ``restore()`` then applies it."""
        raise NotImplementedError(f"{type(self).__name__} does not implement load_snapshot()")

    def snapshot_part(self) -> Any:
        """This rank's own part of the last committed state, for state that
        differs between ranks (a sharded optimizer's), or None (the
        default: the snapshot is the whole state). Every rank writes its
        part next to the host's snapshot."""
        return None

    def holds_shards(self) -> bool:
        """Whether part of the state lives on one rank only (a sharded
        optimizer's): the survivors of a lost rank then cannot go on in
        place, and resume from the last commit."""
        return False

    def recuts_in_place(self) -> bool:
        """Whether the state held in shards can be cut again for a world
        formed in place (hora then keeps a copy of each part on the next
        rank, see :mod:`hora.common.elastic.buddy`)."""
        return False

    def take_part(self) -> Any:
        """Saves this rank's own part of the state now, ahead of the rest
        (which the following ``save()`` keeps), and returns it as
        :meth:`snapshot_part` would; None when there is none."""
        return None

    def sync_replicated(self) -> None:
        """Makes every rank's state rank 0's, but for the parts held in
        shards (their settings, such as the learning rate, included)."""
        self.sync()

    def recut(self) -> None:
        """After :meth:`load_parts`, in a world formed in place: cuts the
        state held in shards again for this world, so that ``restore()``
        keeps this rank's part of it."""

    def drop_step_in_flight(self) -> None:
        """Forgets a training step that a lost rank interrupted (pending
        gradient reductions), before the survivors go on in place."""

    def parts_needed(self) -> int:
        """After :meth:`load_snapshot`: how many ranks' parts the loaded
        commit consists of (the size of the world that committed it), 0
        when it has none."""
        return 0

    def load_parts(self, parts: list[Any]) -> None:
        """After :meth:`load_snapshot`: every rank's part of that commit,
        in the rank order of the world that committed it."""


class ObjectState(State):
    """State made of picklable Python objects, given as keyword arguments
    and exposed as attributes (``state.epoch``, ``state.batch``)."""

    def __init__(self, bcast_object: Callable[..., Any] | None = None,
                 get_rank: Callable[[], int] | None = None, **kwargs: Any):
        # the attributes are the objects given (as in Horovod); what is
        # saved is a copy, so that restore() also undoes changes made to a
        # mutable object in place, and a commit's background write reads
        # nothing training changes
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved_state = {name: copy.deepcopy(value) for name, value in kwargs.items()}
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    if TYPE_CHECKING:
        # the attributes given as keyword arguments, read and set by name
        def __getattr__(self, name: str) -> Any: ...
        def __setattr__(self, name: str, value: Any) -> None: ...

    def save(self) -> None:
        self._saved_state = {name: copy.deepcopy(getattr(self, name))
                             for name in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def snapshot(self) -> Any:
        return {"objects": self._saved_state}

    def load_snapshot(self, snapshot: Any) -> None:
        self._saved_state = dict(snapshot["objects"])

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))
