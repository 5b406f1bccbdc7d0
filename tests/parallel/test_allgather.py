"""allgather of every dtype, with a first dimension that differs per rank."""

import numpy as np
import pytest

import hora
from conftest import ALL_DTYPES, rank_input
from hora_reference import assert_same, dtype_name

# Rows each rank contributes. "zero_on_rank0" gives rank 0 no rows at all.
ROW_PATTERNS = {
    "zero_on_rank0": lambda r: r % 3,
    "growing": lambda r: r + 2,
}


@pytest.mark.parametrize("pattern", sorted(ROW_PATTERNS))
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_allgather_matches_concatenation(dtype, pattern, rank, size):
    rows = ROW_PATTERNS[pattern]
    tag = f"allgather.{dtype_name(dtype)}.{pattern}"
    x = rank_input(tag, rank, (rows(rank), 2, 3), dtype)
    before = x.copy()
    result = hora.allgather(x, name=tag)

    expected = np.concatenate([rank_input(tag, r, (rows(r), 2, 3), dtype) for r in range(size)])
    assert_same(result, expected)
    assert_same(x, before)


@pytest.mark.parametrize("dtype", [np.int32, "bfloat16", np.bool_], ids=dtype_name)
def test_allgather_1d(dtype, rank, size):
    tag = f"allgather.1d.{dtype_name(dtype)}"
    x = rank_input(tag, rank, (rank + 1,), dtype)
    result = hora.allgather(x, name=tag)
    expected = np.concatenate([rank_input(tag, r, (r + 1,), dtype) for r in range(size)])
    assert_same(result, expected)


def test_allgather_rank_ids(rank, size):
    result = hora.allgather(np.array([rank], np.int64), name="allgather.rank_ids")
    assert_same(result, np.arange(size, dtype=np.int64))


def test_allgather_all_ranks_empty(rank, size):
    x = np.zeros((0, 4), np.float32)
    result = hora.allgather(x, name="allgather.all_empty")
    assert_same(result, np.zeros((0, 4), np.float32))


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_allgather_large_enough_for_the_ring(dtype, rank, size):
    """Past 16 MiB gathered the allgather goes around hora's ring (unless
    MPI's is forced), with a different number of rows on every rank and
    none on rank 1."""
    tag = f"allgather.ring.{dtype}"
    columns = 4096 * (4 if dtype == "int8" else 1)
    rows = [0 if r == 1 else 300 * r + 1100 for r in range(size)]
    x = rank_input(tag, rank, (rows[rank], columns), dtype)
    result = hora.allgather(x, name=tag)
    expected = np.concatenate([rank_input(tag, r, (rows[r], columns), dtype)
                               for r in range(size)])
    assert_same(result, expected)
