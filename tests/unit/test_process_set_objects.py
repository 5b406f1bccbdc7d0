"""hora.ProcessSet as an object, before any job: ranks are checked and
sorted, sets compare by id once registered and by ranks before, hash
alike, print their id and ranks, and process_set_id() maps the arguments
every collective takes."""

import pytest

import hora
from hora.common._adapter.checks import process_set_id


def test_ranks_are_sorted_and_checked():
    assert hora.ProcessSet([3, 1, 2]).ranks == [1, 2, 3]
    assert hora.ProcessSet(range(2)).ranks == [0, 1]
    with pytest.raises(ValueError, match=r"rank 1 listed more than once"):
        hora.ProcessSet([1, 0, 1])
    with pytest.raises(ValueError, match="must not be negative"):
        hora.ProcessSet([0, -2])
    with pytest.raises(ValueError, match="must be integers"):
        hora.ProcessSet([0, 1.5])
    with pytest.raises(ValueError, match="list of ranks or an mpi4py communicator"):
        hora.ProcessSet("01")


def test_equality_hash_and_printing():
    a, b = hora.ProcessSet([0, 2]), hora.ProcessSet([2, 0])
    assert a == b and hash(a) == hash(b) and a != hora.ProcessSet([0, 1])
    assert a.size() is None and a.rank() is None  # not registered
    a.process_set_id = 4
    assert a != b  # one registered, one not
    assert repr(a) == "ProcessSet(process_set_id=4, ranks=[0, 2])"
    assert hora.global_process_set.process_set_id == 0
    assert a != "not a set"


def test_process_set_id_of_arguments():
    assert process_set_id(None) == 0
    assert process_set_id(hora.global_process_set) == 0
    registered = hora.ProcessSet([0, 1])
    registered.process_set_id = 7
    assert process_set_id(registered) == 7
    with pytest.raises(hora.HoraInvalidArgumentError, match="allreduce: .* is not registered"):
        process_set_id(hora.ProcessSet([0, 1]), "allreduce")
    with pytest.raises(hora.HoraTypeError, match="allreduce: process_set must be one of hora's"):
        process_set_id([0, 1], "allreduce")
