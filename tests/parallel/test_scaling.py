"""prescale_factor and postscale_factor: floating-point tensors, and integers scaled as
Horovod scales them (in float64, truncated toward zero)."""

import numpy as np
import pytest

import hora
from conftest import rank_input
from hora_reference import (FLOAT_DTYPES, assert_close, assert_same, dtype_name, inputs_of,
                            reduce_reference, reducescatter_block)

# Powers of two keep every result exact; 0.1 and 3.0 do not.
EXACT_FACTORS = [(2.0, 1.0), (1.0, 0.25), (0.5, 4.0)]
INEXACT_FACTORS = [(0.1, 3.0), (1.0, 1.0 / 3.0)]


def check(result, tag, size, shape, dtype, op, pre, post, exact):
    expected = reduce_reference(inputs_of(tag, range(size), shape, dtype), op, dtype, pre, post)
    if exact and op == hora.Sum:
        assert_same(result, expected)
    else:
        # a few roundings apart (scaling in the tensor's type, 1/n as a
        # product); near-zero sums are compared against the input magnitude
        assert_close(result, expected, ulps=4, magnitude=2.0 * size * max(pre, 1) * max(post, 1))


@pytest.mark.parametrize("op", [hora.Sum, hora.Average], ids=["Sum", "Average"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_name)
def test_allreduce_scaled(dtype, op, rank, size):
    tag = f"scale.allreduce.{dtype_name(dtype)}.{int(op)}"
    results = []
    for k, (pre, post) in enumerate(EXACT_FACTORS + INEXACT_FACTORS):
        x = rank_input(f"{tag}.{k}", rank, (11,), dtype)
        results.append(hora.allreduce(x, name=f"{tag}.{k}", op=op, prescale_factor=pre,
                                      postscale_factor=post))
    for k, (pre, post) in enumerate(EXACT_FACTORS + INEXACT_FACTORS):
        check(results[k], f"{tag}.{k}", size, (11,), dtype, op, pre, post,
              exact=k < len(EXACT_FACTORS))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_name)
def test_allreduce_scaled_inplace_and_fused(dtype, rank, size):
    # Several scaled tensors in flight at once go through the fusion buffer.
    tag = f"scale.fused.{dtype_name(dtype)}"
    arrays = [rank_input(f"{tag}.{i}", rank, (i + 2,), dtype) for i in range(6)]
    handles = [hora.allreduce_async_(x, name=f"{tag}.{i}", op=hora.Sum, prescale_factor=0.5,
                                     postscale_factor=2.0) for i, x in enumerate(arrays)]
    results = [hora.synchronize(h) for h in handles]
    for i, (x, result) in enumerate(zip(arrays, results)):
        assert result is x
        check(x, f"{tag}.{i}", size, (i + 2,), dtype, hora.Sum, 0.5, 2.0, exact=True)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_name)
def test_reducescatter_scaled(dtype, rank, size):
    tag = f"scale.reducescatter.{dtype_name(dtype)}"
    shape = (2 * size + 1, 2)
    x = rank_input(tag, rank, shape, dtype)
    summed = hora.reducescatter(x, name=tag + ".sum", op=hora.Sum, prescale_factor=4.0,
                                postscale_factor=0.5)
    averaged = hora.reducescatter(x, name=tag + ".avg", op=hora.Average, prescale_factor=0.5,
                                  postscale_factor=3.0)

    everyone = inputs_of(tag, range(size), shape, dtype)
    assert_same(summed, reducescatter_block(
        reduce_reference(everyone, hora.Sum, dtype, 4.0, 0.5), rank, size))
    assert_close(averaged, reducescatter_block(
        reduce_reference(everyone, hora.Average, dtype, 0.5, 3.0), rank, size),
        ulps=4, magnitude=2.0 * size * 3.0)


def test_grouped_allreduce_scaled(rank, size):
    tag = "scale.grouped"
    spec = [(np.float32, (3,)), (np.float64, (2,)), (np.float16, (4,))]
    inputs = [rank_input(f"{tag}.{i}", rank, shape, dtype) for i, (dtype, shape) in enumerate(spec)]
    results = hora.grouped_allreduce(inputs, name=tag, op=hora.Sum, prescale_factor=2.0,
                                     postscale_factor=0.25)
    for i, ((dtype, shape), result) in enumerate(zip(spec, results)):
        expected = reduce_reference(inputs_of(f"{tag}.{i}", range(size), shape, dtype), hora.Sum,
                                    dtype, 2.0, 0.25)
        assert_same(result, expected)


def test_scaling_with_min_max_product(rank, size):
    # Scale factors apply to every op: Max of (x * pre) * post.
    tag = "scale.minmax"
    x = rank_input(tag, rank, (7,), np.float32)
    got_max = hora.allreduce(x, name=tag + ".max", op=hora.Max, prescale_factor=-2.0)
    got_min = hora.allreduce(x, name=tag + ".min", op=hora.Min, postscale_factor=0.5)
    got_prod = hora.allreduce(x, name=tag + ".prod", op=hora.Product, prescale_factor=2.0,
                              postscale_factor=0.5)
    everyone = inputs_of(tag, range(size), (7,), np.float32)
    assert_same(got_max, reduce_reference(everyone, hora.Max, np.float32, -2.0, 1.0))
    assert_same(got_min, reduce_reference(everyone, hora.Min, np.float32, 1.0, 0.5))
    assert_same(got_prod, reduce_reference(everyone, hora.Product, np.float32, 2.0, 0.5))


INT_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.int32, np.int64]
INT_FACTORS = [(1.0, 0.5), (3.0, 1.0), (1.5, 0.3)]


@pytest.mark.parametrize("op", [hora.Sum, hora.Average, hora.Max], ids=["Sum", "Average", "Max"])
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=dtype_name)
def test_integers_scaled_as_horovod(dtype, op, rank, size):
    tag = f"scale.int.{dtype_name(dtype)}.{int(op)}"
    # in flight together, so they are fused and staged
    handles = [hora.allreduce_async(rank_input(f"{tag}.{k}", rank, (9,), dtype),
                                    name=f"{tag}.{k}", op=op, prescale_factor=pre,
                                    postscale_factor=post)
               for k, (pre, post) in enumerate(INT_FACTORS)]
    for k, ((pre, post), handle) in enumerate(zip(INT_FACTORS, handles)):
        result = hora.synchronize(handle)
        assert result.dtype == np.dtype(dtype)
        expected = reduce_reference(inputs_of(f"{tag}.{k}", range(size), (9,), dtype), op,
                                    dtype, pre, post)
        assert_same(result, expected)


def test_integer_average_truncates_toward_zero(rank, size):
    # Horovod: trunc(post / size * sum), so -5 averaged by 2 ranks is -2
    x = np.array([5 if rank == 0 else 0, -5 if rank == 0 else 0, 7], np.int32)
    got = hora.allreduce(x, name="scale.int.trunc", op=hora.Average, postscale_factor=1.0 / 3)
    sums = np.array([5, -5, 7 * size], np.float64)
    assert_same(got, np.trunc(sums * ((1.0 / 3) / size)).astype(np.int32))


def test_integer_reducescatter_scaled(rank, size):
    tag = "scale.int.reducescatter"
    shape = (2 * size + 1, 2)
    x = rank_input(tag, rank, shape, np.int32)
    got = hora.reducescatter(x, name=tag, op=hora.Average, prescale_factor=2.5,
                             postscale_factor=0.75)
    everyone = inputs_of(tag, range(size), shape, np.int32)
    assert_same(got, reducescatter_block(
        reduce_reference(everyone, hora.Average, np.int32, 2.5, 0.75), rank, size))
