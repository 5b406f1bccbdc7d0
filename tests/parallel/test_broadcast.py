"""broadcast of every dtype from every root rank."""

import numpy as np
import pytest

import hora
from conftest import ALL_DTYPES, rank_input
from hora_reference import assert_same, dtype_name


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_broadcast_from_each_root(dtype, rank, size):
    tag = f"broadcast.{dtype_name(dtype)}"
    inputs, results = {}, {}
    for root in range(size):
        x = rank_input(f"{tag}.{root}", rank, (4, 3), dtype)
        inputs[root] = (x, x.copy())
        results[root] = hora.broadcast(x, root, name=f"{tag}.{root}")

    for root in range(size):
        expected = rank_input(f"{tag}.{root}", root, (4, 3), dtype)
        assert_same(results[root], expected)
        x, before = inputs[root]
        assert results[root] is not x
        assert_same(x, before)  # out of place: the input is untouched on every rank


@pytest.mark.parametrize("dtype", [np.float32, "bfloat16", np.bool_], ids=dtype_name)
def test_broadcast_inplace_from_each_root(dtype, rank, size):
    tag = f"broadcast_.{dtype_name(dtype)}"
    arrays, results = {}, {}
    for root in range(size):
        arrays[root] = rank_input(f"{tag}.{root}", rank, (5,), dtype)
        results[root] = hora.broadcast_(arrays[root], root, name=f"{tag}.{root}")

    for root in range(size):
        assert results[root] is arrays[root]
        assert_same(arrays[root], rank_input(f"{tag}.{root}", root, (5,), dtype))


def test_broadcast_root_keyword_and_numpy_int_root(rank, size):
    root = np.int64(size - 1)
    x = np.full(3, rank, np.int32)
    by_keyword = hora.broadcast(x, root_rank=root, name="broadcast.keyword")
    assert_same(by_keyword, np.full(3, size - 1, np.int32))
