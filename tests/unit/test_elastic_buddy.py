"""Which commit a world formed in place restores state held in shards
from (hora.common.elastic.buddy.choose), and what each rank keeps of the
buddy copies; the exchange itself runs in tests/test_elastic_jobs.py."""

import pickle

from hora.common.elastic.buddy import BuddyCopies, choose


def _held(commit, size, *indices):
    return [(commit, size, i) for i in indices]


def test_the_lost_ranks_part_comes_from_its_buddy():
    # 4 ranks committed 5; rank 3 lost; rank 0 holds its own part and rank 3's
    reports = [(5, _held(5, 4, 0, 3)), (5, _held(5, 4, 1, 0)), (5, _held(5, 4, 2, 1))]
    assert choose(reports) == (5, 4, [0, 1, 2, 0], 0)


def test_a_part_and_its_only_copy_lost_leaves_nothing_whole():
    # ranks 2 and 3 of 4 lost: part 2 lived on both
    reports = [(5, _held(5, 4, 0, 3)), (5, _held(5, 4, 1, 0))]
    assert choose(reports) is None


def test_an_exchange_cut_short_goes_back_to_the_commit_before():
    # rank 1 finished the exchange of commit 6 and saved it; rank 0 lost
    # the copy of rank 3's part of 6 (rank 3 died sending it) and still
    # holds commit 5: 6 is not whole, 5 is, and its state is on rank 0
    reports = [(5, _held(5, 4, 0, 3) + _held(6, 4, 0)),
               (6, _held(5, 4, 1, 0) + _held(6, 4, 1, 0)),
               (5, _held(5, 4, 2, 1) + _held(6, 4, 2))]
    assert choose(reports) == (5, 4, [0, 1, 2, 0], 0)


def test_the_newest_whole_commit_wins_and_takes_its_state_from_a_rank_that_saved_it():
    reports = [(5, _held(5, 4, 0, 3) + _held(6, 4, 0, 3)),
               (6, _held(5, 4, 1, 0) + _held(6, 4, 1, 0)),
               (6, _held(5, 4, 2, 1) + _held(6, 4, 2, 1))]
    commit, size, holders, source = choose(reports)
    assert (commit, size, source) == (6, 4, 1)
    assert sorted(set(holders)) == [0, 1, 2] and len(holders) == 4


def test_a_commit_saved_by_no_rank_is_not_chosen_and_joiners_hold_nothing():
    # every part of 6 is there, but no rank saved the rest of the state as 6
    reports = [(5, _held(5, 2, 0, 1) + _held(6, 2, 0, 1)), (-1, [])]
    assert choose(reports) == (5, 2, [0, 0], 0)
    assert choose([(-1, []), (-1, [])]) is None


def test_parts_cut_for_another_world_size_serve_as_well():
    # after a re-cut for 3 ranks one set is whole, the 4-rank one is not
    reports = [(5, _held(5, 4, 0) + _held(5, 3, 0, 2)), (5, _held(5, 3, 1, 0))]
    assert choose(reports) == (5, 3, [0, 1, 0], 0)


def test_a_rank_forgets_the_parts_of_abandoned_commits():
    copies = BuddyCopies()
    for commit in (1, 2, 3):  # a world of one: its own part only
        copies.parts[(commit, 1, 0)] = pickle.dumps({"commit": commit})
    copies.forget_after(2)
    assert copies.inventory() == [(1, 1, 0), (2, 1, 0)]
    assert copies.load((2, 1, 0)) == {"commit": 2}
