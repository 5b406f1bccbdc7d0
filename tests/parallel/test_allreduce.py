"""allreduce of every dtype with every reduce op, against the NumPy reference."""

import numpy as np
import pytest

import hora
from conftest import ALL_DTYPES, rank_input, resolve_dtype
from hora_reference import (ALL_OPS, FLOAT_DTYPES, HALVES_TRAVEL, assert_reduced, assert_same,
                            dtype_name, inputs_of, is_bool, op_name, reduce_reference)

SHAPE = (5, 3)


@pytest.mark.parametrize("op", ALL_OPS, ids=op_name)
@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_allreduce_matches_numpy(dtype, op, rank, size):
    if is_bool(dtype) and op == hora.Average:
        pytest.skip("Average is not defined for bool (tested in test_call_errors.py)")
    tag = f"allreduce.{dtype_name(dtype)}.{op_name(op)}"
    x = rank_input(tag, rank, SHAPE, dtype)
    before = x.copy()
    result = hora.allreduce(x, name=tag, op=op)

    expected = reduce_reference(inputs_of(tag, range(size), SHAPE, dtype), op, dtype)
    assert_reduced(result, expected, op)
    assert result is not x
    assert_same(x, before)  # the out-of-place variant leaves its input alone


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_allreduce_default_op_is_average(dtype, rank, size):
    tag = f"allreduce.default.{dtype_name(dtype)}"
    x = rank_input(tag, rank, (7,), dtype)
    if is_bool(dtype):
        with pytest.raises(ValueError, match="Average"):
            hora.allreduce(x, name=tag)
        return
    result = hora.allreduce(x, name=tag)
    expected = reduce_reference(inputs_of(tag, range(size), (7,), dtype), hora.Average, dtype)
    assert_reduced(result, expected, hora.Average)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64], ids=dtype_name)
def test_integer_average_truncates_toward_zero(dtype, rank, size):
    # Every rank contributes -1 except rank 0 (-2): the true mean lies in
    # (-2, -1], so a floor division would give -2 where trunc gives -1 (for
    # size > 1), and the positive mirror image checks the other direction.
    tag = f"allreduce.trunc.{dtype_name(dtype)}"
    values = np.array([-2 if rank == 0 else -1, 2 if rank == 0 else 1, 0, 5], dtype=dtype)
    result = hora.allreduce(values, name=tag, op=hora.Average)

    contributions = [np.array([-2 if r == 0 else -1, 2 if r == 0 else 1, 0, 5], np.int64)
                     for r in range(size)]
    total = np.sum(contributions, axis=0)
    expected = (np.sign(total) * (np.abs(total) // size)).astype(dtype)
    assert_same(result, expected)
    if size > 1:
        assert result[0] == -1 and result[1] == 1


def test_unsigned_average(rank, size):
    tag = "allreduce.uint8.average"
    x = np.array([rank, 3, 255 // size, 1], dtype=np.uint8)
    result = hora.allreduce(x, name=tag, op=hora.Average)
    total = np.sum([[r, 3, 255 // size, 1] for r in range(size)], axis=0)
    assert_same(result, (total // size).astype(np.uint8))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types_accumulate_in_float32(dtype, rank, size):
    # 2048 (float16) and 256 (bfloat16) have a spacing of 2 between
    # neighbours, so adding 1 at a time in the half type would get stuck at
    # the first value, while a float32 accumulation rounded once gives
    # big + (size - 1) whenever that is representable.
    big = 2048.0 if dtype == "float16" else 256.0
    d = resolve_dtype(dtype)
    x = np.array([big if rank == 0 else 1.0] * 4, dtype=np.float32).astype(d)
    result = hora.allreduce(x, name=f"allreduce.accumulate.{dtype}", op=hora.Sum)
    expected = np.full(4, big + (size - 1), np.float32).astype(d)
    if HALVES_TRAVEL:
        # rounded at each hop: off by at most the spacing (2) per hop, and
        # the same on every rank
        assert np.all(np.abs(result.astype(np.float32) - expected.astype(np.float32))
                      <= 2 * (size - 1)), result
        gathered = hora.allgather(result[None], name=f"allreduce.accumulate.{dtype}.check")
        assert all(np.array_equal(row, result) for row in gathered)
    else:
        assert_same(result, expected)


def test_float16_average_does_not_overflow(rank, size):
    # 40000 is close to float16's maximum (65504): a float16 accumulation
    # of two or more ranks overflows to inf, a float32 one does not (and the
    # ring, which sums halves, divides first).
    x = np.full(3, 40000, np.float16)
    averaged = hora.allreduce(x, name="allreduce.f16_overflow", op=hora.Average)
    scaled = hora.allreduce(x, name="allreduce.f16_overflow.scaled", op=hora.Sum,
                            postscale_factor=1.0 / size)
    assert_same(averaged, np.full(3, 40000, np.float16))
    assert_same(scaled, np.full(3, 40000, np.float16))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_bool_and_numeric_extremes(dtype, rank, size):
    """Min/Max with the dtype's extreme values on one rank."""
    d = resolve_dtype(dtype)
    tag = f"allreduce.extremes.{dtype_name(dtype)}"
    if is_bool(dtype):
        low, high = False, True
    elif np.issubdtype(d, np.integer):
        low, high = np.iinfo(d).min, np.iinfo(d).max
    else:
        low, high = -1000.0, 1000.0

    def contribution(r):
        values = rank_input(tag, r, (6,), dtype)
        values[r % 6] = low if r % 2 == 0 else high
        return values

    x = contribution(rank)
    got_min = hora.allreduce(x, name=tag + ".min", op=hora.Min)
    got_max = hora.allreduce(x, name=tag + ".max", op=hora.Max)
    everyone = [contribution(r) for r in range(size)]
    assert_same(got_min, reduce_reference(everyone, hora.Min, dtype))
    assert_same(got_max, reduce_reference(everyone, hora.Max, dtype))


def test_results_written_into_given_arrays(rank, size):
    tag = "allreduce.out"
    x = rank_input(tag, rank, SHAPE, np.float32)
    out = np.full(SHAPE, np.nan, np.float32)
    result = hora.synchronize(hora.allreduce_async(x, name=tag, op=hora.Sum, out=out))
    assert result is out
    assert_reduced(out, reduce_reference(inputs_of(tag, range(size), SHAPE, np.float32),
                                         hora.Sum, np.float32), hora.Sum)
    members = [rank_input(f"{tag}.{k}", rank, (k + 2,), np.float64) for k in range(3)]
    outs = [np.empty_like(m) for m in members]
    results = hora.synchronize(hora.grouped_allreduce_async(members, name=f"{tag}.group",
                                                            op=hora.Max, out=outs))
    for k, (got, given) in enumerate(zip(results, outs)):
        assert got is given
        expected = reduce_reference(inputs_of(f"{tag}.{k}", range(size), (k + 2,), np.float64),
                                    hora.Max, np.float64)
        assert_reduced(got, expected, hora.Max)


def test_given_arrays_that_do_not_fit_are_refused_before_anything_is_sent(rank, size):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match=r"allreduce 'bad.out': out has shape \(3,\) and dtype "
                                         r"float32, the input \(4,\) and float32"):
        hora.allreduce_async(x, name="bad.out", out=np.empty(3, np.float32))
    with pytest.raises(ValueError, match="float64, the input"):
        hora.allreduce_async(x, name="bad.out", out=np.empty(4, np.float64))
    with pytest.raises(ValueError, match="writable C-contiguous"):
        hora.allreduce_async(x, name="bad.out", out=np.empty(8, np.float32)[::2])
    with pytest.raises(TypeError, match="out must be a NumPy array, got list"):
        hora.allreduce_async(x, name="bad.out", out=[0.0] * 4)
    with pytest.raises(ValueError, match="2 tensors but 1 arrays in out"):
        hora.grouped_allreduce_async([x, x], name="bad.group", out=[np.empty(4, np.float32)])
    # nothing was submitted: the same names work afterwards
    assert hora.allreduce(x, name="bad.out", op=hora.Sum)[0] == size


def test_a_given_array_that_overlaps_its_input_is_refused(rank, size):
    x = np.ones(8, np.float32)
    with pytest.raises(ValueError, match="out overlaps the input; use the in-place variant"):
        hora.allreduce_async(x, name="bad.overlap", out=x)


@pytest.mark.parametrize("op", [hora.Min, hora.Max], ids=op_name)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_name)
@pytest.mark.parametrize("count", [7, 70001])
def test_min_max_keep_a_nan_from_any_rank(dtype, op, count, rank, size):
    """Min and Max propagate NaN as NumPy's minimum and maximum do, whichever
    rank holds it and whatever the algorithm (the suite runs this under each
    one), in the vectorized body and the tail of the kernels alike."""
    for holder in range(size):
        tag = f"allreduce.nan.{dtype_name(dtype)}.{op_name(op)}.{count}.{holder}"

        def contribution(r, tag=tag, holder=holder):
            values = rank_input(tag, r, (count,), dtype)
            if r == holder:
                for at in (0, count // 2, count - 1):
                    values[at] = np.nan
            return values

        got = hora.allreduce(contribution(rank), name=tag, op=op)
        expected = reduce_reference([contribution(r) for r in range(size)], op, dtype)
        assert np.isnan(np.asarray(got, np.float64)[[0, count // 2, count - 1]]).all()
        assert_same(got, expected)
