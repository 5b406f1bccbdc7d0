"""The shard layout alone: every element of every bucket is owned by
exactly one rank, shards are balanced to within one element (the split a
reducescatter makes), pieces and owners agree, and the fingerprint names
the parameters and buckets but not the number of ranks."""

import pytest

from hora.common.shard_layout import ShardLayout, shard_bounds

NUMELS = [7, 1, 300, 64, 5, 1000, 3]
UNITS = [[6, 5], [4, 3, 2], [1, 0]]


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 16])
def test_every_element_is_owned_once_and_shards_are_balanced(size):
    layout = ShardLayout(NUMELS, UNITS, size)
    owned = {(position, element): 0 for position, n in enumerate(NUMELS) for element in range(n)}
    for rank in range(size):
        for piece in layout.pieces(rank):
            bucket = layout.buckets[piece.bucket]
            start, _ = layout.bounds(piece.bucket, rank)
            # where the piece lies in the rank's shard of the flat bucket
            assert piece.offset == layout.offset_of[piece.param] + piece.start - start
            assert piece.param in bucket.members
            for element in range(piece.start, piece.stop):
                owned[(piece.param, element)] += 1
    assert set(owned.values()) == {1}
    for b, bucket in enumerate(layout.buckets):
        sizes = [layout.shard_numel(b, rank) for rank in range(size)]
        assert sum(sizes) == bucket.numel
        assert max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)  # the first ranks take the extra


@pytest.mark.parametrize("size", [2, 3, 5])
def test_owners_match_the_pieces(size):
    layout = ShardLayout(NUMELS, UNITS, size)
    for position in range(len(NUMELS)):
        owners = layout.owners(position)
        assert owners[0][1] == 0
        assert owners[-1][2] == NUMELS[position]
        for before, after in zip(owners, owners[1:]):
            assert before[2] == after[1]  # the ranges meet
        for rank, start, stop in owners:
            piece = [p for p in layout.pieces(rank) if p.param == position]
            assert len(piece) == 1 and (piece[0].start, piece[0].stop) == (start, stop)


def test_the_split_is_reducescatters():
    assert [shard_bounds(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert [shard_bounds(2, 4, r) for r in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


def test_the_fingerprint_names_parameters_and_buckets_not_ranks():
    two, three = ShardLayout(NUMELS, UNITS, 2), ShardLayout(NUMELS, UNITS, 3)
    assert two.fingerprint() == three.fingerprint()
    assert ShardLayout(NUMELS, UNITS, 2).fingerprint() != ShardLayout(
        NUMELS, [[6, 5, 4], [3, 2], [1, 0]], 2).fingerprint()
    assert ShardLayout(NUMELS, UNITS, 2).fingerprint() != ShardLayout(
        [8] + NUMELS[1:], UNITS, 2).fingerprint()


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError, match="in no bucket"):
        ShardLayout(NUMELS, UNITS[:2], 2)
    with pytest.raises(ValueError, match="in two buckets"):
        ShardLayout(NUMELS, UNITS + [[0]], 2)
    with pytest.raises(ValueError, match="at least one rank"):
        ShardLayout(NUMELS, UNITS, 0)
