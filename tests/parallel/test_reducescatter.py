"""reducescatter of every dtype with a first dimension that does not divide evenly."""

import numpy as np
import pytest

import hora
from conftest import ALL_DTYPES, rank_input
from hora_reference import (ALL_OPS, assert_reduced, assert_same, dtype_name, inputs_of,
                            is_bool, op_name, reduce_reference, reducescatter_block,
                            reducescatter_rows)


@pytest.mark.parametrize("op", ALL_OPS, ids=op_name)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_reducescatter_uneven_rows(dtype, op, rank, size):
    if is_bool(dtype) and op == hora.Average:
        pytest.skip("Average is not defined for bool (tested in test_call_errors.py)")
    tag = f"reducescatter.{dtype_name(dtype)}.{op_name(op)}"
    shape = (2 * size + 1, 3)
    x = rank_input(tag, rank, shape, dtype)
    before = x.copy()
    result = hora.reducescatter(x, name=tag, op=op)

    full = reduce_reference(inputs_of(tag, range(size), shape, dtype), op, dtype)
    expected = reducescatter_block(full, rank, size)
    assert result.shape == (reducescatter_rows(shape[0], size)[rank], 3)
    assert_reduced(result, expected, op)
    assert_same(x, before)


def test_reducescatter_first_ranks_get_extra_rows(rank, size):
    rows = 2 * size + 1
    mine = hora.reducescatter(rank_input("rs.counts", rank, (rows, 2), "float32"),
                              name="reducescatter.counts", op=hora.Sum)
    # allgather the row counts so every rank checks the whole layout
    layout = hora.allgather(np.array([mine.shape[0]], np.int64),
                            name="reducescatter.counts.layout")
    assert list(layout) == [3] + [2] * (size - 1)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64"])
def test_reducescatter_default_op_is_average(dtype, rank, size):
    tag = f"reducescatter.default.{dtype}"
    shape = (size + 2, 2)
    result = hora.reducescatter(rank_input(tag, rank, shape, dtype), name=tag)
    full = reduce_reference(inputs_of(tag, range(size), shape, dtype), hora.Average, dtype)
    assert_reduced(result, reducescatter_block(full, rank, size), hora.Average)


def test_reducescatter_3d(rank, size):
    tag = "reducescatter.3d"
    shape = (size + 1, 2, 3)
    result = hora.reducescatter(rank_input(tag, rank, shape, "int32"), name=tag, op=hora.Sum)
    full = reduce_reference(inputs_of(tag, range(size), shape, "int32"), hora.Sum, "int32")
    assert_same(result, reducescatter_block(full, rank, size))


def test_reducescatter_float16_average_does_not_overflow(rank, size):
    x = np.full((size + 1, 2), 40000, np.float16)
    result = hora.reducescatter(x, name="reducescatter.f16_overflow", op=hora.Average)
    assert_same(result, np.full((reducescatter_rows(size + 1, size)[rank], 2), 40000, np.float16))


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
@pytest.mark.parametrize("op", [hora.Sum, hora.Average, hora.Max], ids=op_name)
def test_reducescatter_large_enough_for_the_ring(dtype, op, rank, size):
    """Past 64 KiB the reducescatter goes around hora's ring (unless MPI's
    is forced): rows of 301 elements, a count that does not divide evenly,
    the halves widened to float32 on the way."""
    tag = f"reducescatter.ring.{dtype}.{op_name(op)}"
    shape = (40 * size + 3, 301)
    x = rank_input(tag, rank, shape, dtype)
    before = x.copy()
    result = hora.reducescatter(x, name=tag, op=op)
    full = reduce_reference(inputs_of(tag, range(size), shape, dtype), op, dtype)
    assert result.shape == (reducescatter_rows(shape[0], size)[rank], 301)
    assert_reduced(result, reducescatter_block(full, rank, size), op)
    assert_same(x, before)
