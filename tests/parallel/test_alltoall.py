"""alltoall of every dtype, with uneven splits and with splits=None."""

import numpy as np
import pytest

import hora
from conftest import ALL_DTYPES, rank_input
from hora_reference import assert_same, dtype_name


def uneven_splits(sender, size):
    """Rows rank ``sender`` sends to each rank: uneven, with some zeros."""
    return [(sender + 2 * dest) % 3 for dest in range(size)]


def expected_alltoall(tag, me, size, splits_of, row_shape, dtype):
    pieces, received = [], []
    for sender in range(size):
        splits = splits_of(sender)
        x = rank_input(tag, sender, (sum(splits),) + row_shape, dtype)
        start = sum(splits[:me])
        pieces.append(x[start:start + splits[me]])
        received.append(splits[me])
    return np.concatenate(pieces), np.array(received, np.int64)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_alltoall_uneven_splits(dtype, rank, size):
    tag = f"alltoall.uneven.{dtype_name(dtype)}"
    splits = uneven_splits(rank, size)
    x = rank_input(tag, rank, (sum(splits), 2), dtype)
    before = x.copy()
    output, received = hora.alltoall(x, splits=splits, name=tag)

    expected, expected_received = expected_alltoall(
        tag, rank, size, lambda s: uneven_splits(s, size), (2,), dtype)
    assert_same(output, expected)
    assert_same(received, expected_received)
    assert_same(x, before)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_alltoall_even_without_splits(dtype, rank, size):
    tag = f"alltoall.even.{dtype_name(dtype)}"
    x = rank_input(tag, rank, (2 * size, 3), dtype)
    output, received = hora.alltoall(x, name=tag)

    expected, expected_received = expected_alltoall(
        tag, rank, size, lambda s: [2] * size, (3,), dtype)
    assert_same(output, expected)
    assert_same(received, expected_received)


def test_alltoall_splits_as_numpy_array_1d(rank, size):
    tag = "alltoall.numpy_splits"
    splits = np.array([rank + 1] * size, dtype=np.int32)
    x = rank_input(tag, rank, (int(splits.sum()),), np.float64)
    output, received = hora.alltoall(x, splits=splits, name=tag)
    expected, expected_received = expected_alltoall(
        tag, rank, size, lambda s: [s + 1] * size, (), np.float64)
    assert_same(output, expected)
    assert_same(received, expected_received)


def test_alltoall_everything_to_rank0(rank, size):
    tag = "alltoall.to_rank0"
    splits = [3] + [0] * (size - 1)
    x = rank_input(tag, rank, (3, 2, 2), np.int16)
    output, received = hora.alltoall(x, splits=splits, name=tag)
    expected, expected_received = expected_alltoall(
        tag, rank, size, lambda s: [3] + [0] * (size - 1), (2, 2), np.int16)
    assert_same(output, expected)
    assert_same(received, expected_received)
    if rank != 0:
        assert output.shape == (0, 2, 2)


def test_rows_past_the_splits_are_not_sent_and_no_splits_mean_even_ones(rank, size):
    # as in Horovod: splits may sum to less than the first dimension (the
    # rows after them stay behind), and an empty splits list splits evenly
    tag = "alltoall.prefix"
    splits = [1] * size
    x = rank_input(tag, rank, (size + 3, 2), np.float32)
    output, received = hora.alltoall(x, splits=splits, name=tag)
    # row k of every rank's tensor goes to rank k; rows size.. stay
    expected = np.stack([rank_input(tag, sender, (size + 3, 2), np.float32)[rank]
                         for sender in range(size)])
    assert_same(output, expected)
    assert_same(received, np.ones(size, np.int64))
    output, received = hora.alltoall(x[:size], splits=[], name="alltoall.empty_splits")
    assert output.shape == (size, 2) and received.tolist() == [1] * size
