"""Buddy copies of state held in shards (a sharded optimizer's), so that a
world re-formed in place can restore it without the lost ranks.

At every ``commit()`` of an in-place elastic job each rank sends its part
of the commit (its shard of the optimizer state, pickled) to the next rank
(``rank + 1`` modulo the size) and keeps the previous rank's: each part
then lives on two ranks, in host memory. After a loss the survivors pool
what they hold, pick the newest commit they can restore whole (every part
somewhere, and the rest of the state on some survivor), merge its parts and
cut them again for the new world. The loss of two neighbouring ranks (a
part and its only copy) leaves no such commit; the survivors then leave
for a relaunch from the disk copy.

The exchange of commit ``c`` comes before the rest of the state is saved
as ``c``, and each rank keeps the parts of its last two commits: when a
loss interrupts the exchange, the survivors that finished it hold commit
``c`` and the others still ``c - 1``, and one of the two is whole.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

# (commit, size of the world that cut the parts, index of the part)
Key = tuple[int, int, int]


class BuddyCopies:
    """This rank's own parts and its neighbour's, of its last two commits."""

    def __init__(self) -> None:
        self.parts: dict[Key, bytes] = {}

    def exchange(self, commit: int, part: Any) -> None:
        """Collective: keeps ``part`` as this rank's part of ``commit`` and
        the previous rank's from it, and forgets the parts of all but the
        two newest commits it holds."""
        from hora.common.basics import rank, size
        from hora.common.ops import alltoall
        me, n = rank(), size()
        payload = pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
        if n > 1:
            splits = [0] * n
            splits[(me + 1) % n] = len(payload)
            received, _ = alltoall(np.frombuffer(payload, np.uint8), splits,
                                   name="hora.elastic.buddy")
            self.parts[(commit, n, (me - 1) % n)] = received.tobytes()
        self.parts[(commit, n, me)] = payload
        kept = sorted({key[0] for key in self.parts})[-2:]
        for key in [k for k in self.parts if k[0] not in kept]:
            del self.parts[key]

    def hand_over(self, leaving: list[int]) -> None:
        """Collective, before the ranks ``leaving`` leave the world (their
        hosts were removed): each gives every part it holds of its newest
        commit to a rank that stays, so that the world left behind holds
        that commit whole even when neighbouring ranks leave together."""
        from hora.common.basics import rank, size
        from hora.common.ops import alltoall
        me, n = rank(), size()
        staying = [r for r in range(n) if r not in leaving]
        splits = [0] * n
        payload = b""
        if me in leaving and self.parts:
            newest = max(key[0] for key in self.parts)
            payload = pickle.dumps({k: v for k, v in self.parts.items() if k[0] == newest},
                                   protocol=pickle.HIGHEST_PROTOCOL)
            splits[staying[leaving.index(me) % len(staying)]] = len(payload)
        received, counts = alltoall(np.frombuffer(payload, np.uint8), splits,
                                    name="hora.elastic.buddy.leaving")
        data, offset = received.tobytes(), 0
        for count in counts:
            if count:
                self.parts.update(pickle.loads(data[offset:offset + int(count)]))
            offset += int(count)

    def inventory(self) -> list[Key]:
        return sorted(self.parts)

    def load(self, key: Key) -> Any:
        return pickle.loads(self.parts[key])

    def forget_after(self, commit: int) -> None:
        """Forgets the parts of commits after ``commit`` (abandoned: the
        world goes on from ``commit``)."""
        for key in [k for k in self.parts if k[0] > commit]:
            del self.parts[key]


def choose(reports: list[tuple[int, list[Key]]]) -> tuple[int, int, list[int], int] | None:
    """What a world restores from, given each rank's ``(commit its state
    was last saved at, or -1 for a process that has none yet; the parts it
    holds)``: ``(commit, parts, the rank to take each part from, the rank
    to take the rest of the state from)``, for the newest commit held
    whole, or None. Each part comes from the rank that holds the fewest
    chosen so far (the parts are broadcast one by one, so the choice only
    spreads the reading)."""
    saved = {commit for commit, _ in reports if commit >= 0}
    for commit in sorted(saved, reverse=True):
        source = min(r for r, (c, _) in enumerate(reports) if c == commit)
        sizes = sorted({size for _, held in reports for c, size, _ in held if c == commit})
        for size in sizes:
            holders: list[int] = []
            load = [0] * len(reports)
            for index in range(size):
                who = [r for r, (_, held) in enumerate(reports) if (commit, size, index) in held]
                if not who:
                    break
                pick = min(who, key=lambda r: (load[r], r))
                load[pick] += 1
                holders.append(pick)
            else:
                return commit, size, holders, source
    return None
