"""The process sets the multi-rank tests use at any world size: the even
ranks and the odd ranks, each rank using the one it is in. Every rank adds
and removes them in the same order. On one rank the evens would be every
rank, a set that exists already as the global set (a set may exist only
once, as in Horovod), so the global set stands in and there are no odds."""

import pytest

import hora


class ParitySets:
    def __init__(self):
        size, rank = hora.size(), hora.rank()
        if size > 1:
            self.evens = hora.add_process_set(range(0, size, 2))
            self.odds = hora.add_process_set(range(1, size, 2))
        else:
            self.evens, self.odds = hora.global_process_set, None
        self.mine = self.evens if rank % 2 == 0 else self.odds
        self.other = None if self.odds is None else (
            self.odds if self.mine is self.evens else self.evens)

    def remove(self):
        hora.barrier()
        for ps in (self.evens, self.odds):
            if ps is not None and ps is not hora.global_process_set:
                assert hora.remove_process_set(ps)


def parity_fixture():
    """(evens, odds or None, this rank's set), removed after the test."""
    made = ParitySets()
    yield made.evens, made.odds, made.mine
    made.remove()


def other_set(sets):
    """The set this rank is not in; skips the test on one rank."""
    evens, odds, mine = sets
    if odds is None:
        pytest.skip("needs two sets")
    return odds if mine is evens else evens
