"""horarun's own launch (hora.runner.tcp_launch): where each rank goes."""
import pytest

from hora.runner.hosts import Host
from hora.runner.tcp_launch import free_slots, placements


def test_ranks_fill_the_hosts_slots_in_order():
    assert placements(3, [Host("a", 2), Host("b", 2)]) == [("a", 0, 2), ("a", 1, 2), ("b", 0, 1)]
    assert placements(2, [Host("localhost", 4)]) == [("localhost", 0, 2), ("localhost", 1, 2)]


def test_more_ranks_than_slots_is_an_error():
    with pytest.raises(ValueError, match="3 ranks do not fit in the hosts' 2 slots"):
        placements(3, [Host("a", 1), Host("b", 1)])


def test_replacements_go_to_the_slots_the_live_processes_leave_free():
    capacity = {"a": 2, "b": 2}
    assert free_slots(capacity, ["a", "a", "b"], set()) == [Host("b", 1)]
    assert free_slots(capacity, ["a", "b"], set()) == [Host("a", 1), Host("b", 1)]
    assert free_slots(capacity, ["a", "a", "b", "b"], set()) == []


def test_no_replacement_goes_to_a_host_lost_whole():
    assert free_slots({"a": 2, "b": 2}, ["a", "a"], {"b"}) == []
    assert free_slots({"a": 2, "b": 2}, ["a"], {"b"}) == [Host("a", 1)]
