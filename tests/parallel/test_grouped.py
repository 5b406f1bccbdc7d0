"""grouped_allreduce and its in-place and async variants on mixed dtypes."""

import numpy as np
import pytest

import hora
from conftest import rank_input
from hora_reference import assert_reduced, assert_same, dtype_name, inputs_of, reduce_reference

# (dtype, shape) of each member; bool is fine with Sum (logical or).
MIXED = [(np.float32, (3, 2)), (np.int64, (5,)), (np.float16, (4,)), (np.int8, (2, 2, 2)),
         (np.float64, ()), (np.bool_, (6,)), (np.uint8, (1,)), (np.float32, (0,))]


def members(tag, rank, spec=MIXED):
    # np.array: rank_input gives a (read-only) NumPy scalar for 0-d floats
    return [np.array(rank_input(f"{tag}.{i}", rank, shape, dtype))
            for i, (dtype, shape) in enumerate(spec)]


def expected_members(tag, size, op, spec=MIXED):
    return [reduce_reference(inputs_of(f"{tag}.{i}", range(size), shape, dtype), op, dtype)
            for i, (dtype, shape) in enumerate(spec)]


def test_grouped_allreduce_mixed_dtypes(rank, size):
    tag = "grouped.mixed"
    inputs = members(tag, rank)
    before = [x.copy() for x in inputs]
    results = hora.grouped_allreduce(inputs, name=tag, op=hora.Sum)

    assert isinstance(results, list) and len(results) == len(MIXED)
    for result, expected, x, saved in zip(results, expected_members(tag, size, hora.Sum),
                                          inputs, before):
        assert result is not x
        assert_same(result, expected)
        assert_same(x, saved)


def test_grouped_allreduce_inplace_mixed_dtypes(rank, size):
    tag = "grouped.inplace"
    inputs = members(tag, rank)
    results = hora.grouped_allreduce_(inputs, name=tag, op=hora.Max)

    assert len(results) == len(inputs)
    for result, x, expected in zip(results, inputs, expected_members(tag, size, hora.Max)):
        assert result is x
        assert_same(x, expected)


def test_grouped_allreduce_async(rank, size):
    tag = "grouped.async"
    spec = [(np.float32, (4,)), (np.int32, (3,)), (np.float64, (2, 2))]
    inputs = members(tag, rank, spec)
    handle = hora.grouped_allreduce_async(inputs, name=tag)  # Average
    inplace_inputs = members(tag + "_", rank, spec)
    inplace_handle = hora.grouped_allreduce_async_(inplace_inputs, name=tag + "_", op=hora.Min)
    results = hora.synchronize(handle)
    inplace_results = hora.synchronize(inplace_handle)
    assert hora.poll(handle) and hora.poll(inplace_handle)

    for result, expected in zip(results, expected_members(tag, size, hora.Average, spec)):
        assert_reduced(result, expected, hora.Average)
    for result, x, expected in zip(inplace_results, inplace_inputs,
                                   expected_members(tag + "_", size, hora.Min, spec)):
        assert result is x
        assert_same(x, expected)


@pytest.mark.parametrize("layout", ["half_last", "float32_last", "half_only"])
@pytest.mark.parametrize("dtype", [np.float16, "bfloat16"], ids=dtype_name)
def test_grouped_allreduce_half_types(dtype, layout, rank, size):
    # Each member keeps its own dtype, whatever the order of the members.
    tag = f"grouped.half.{dtype_name(dtype)}.{layout}"
    spec = {
        "half_last": [(dtype, (5,)), (np.float32, (3,)), (dtype, (2, 3))],
        "float32_last": [(dtype, (5,)), (np.int32, (2,)), (np.float32, (3,))],
        "half_only": [(dtype, (5,)), (dtype, (1,))],
    }[layout]
    results = hora.grouped_allreduce(members(tag, rank, spec), name=tag, op=hora.Sum)
    for result, expected in zip(results, expected_members(tag, size, hora.Sum, spec)):
        assert_same(result, expected)


def test_grouped_allreduce_single_and_empty_list(rank, size):
    tag = "grouped.single"
    one = hora.grouped_allreduce([np.full(3, rank, np.int32)], name=tag, op=hora.Sum)
    none = hora.grouped_allreduce([], name="grouped.empty", op=hora.Sum)
    assert len(one) == 1
    assert_same(one[0], np.full(3, size * (size - 1) // 2, np.int32))
    assert none == []


def test_grouped_allreduce_repeated(rank, size):
    # Groups are not response-cached; running the same group again must
    # still negotiate and give the right answer each time.
    tag = "grouped.repeat"
    outputs = []
    for step in range(3):
        inputs = [np.full(4, rank + step, np.int32), np.full(2, float(rank * step), np.float32)]
        outputs.append(hora.grouped_allreduce(inputs, name=tag, op=hora.Sum))
    ranks_total = size * (size - 1) // 2
    for step, (ints, floats) in enumerate(outputs):
        assert_same(ints, np.full(4, ranks_total + size * step, np.int32))
        assert_same(floats, np.full(2, float(ranks_total * step), np.float32))
