"""allreduce with op=Adasum (the NumPy and torch faces) against a NumPy
reference of the same tree: orthogonal vectors add up, parallel ones
average, random ones match; every tensor of a fused or grouped submission
gets its own coefficients; sizes that are not a power of two, integers and
reducescatter are refused on every rank with a clear error."""

import zlib

import numpy as np
import pytest
from conftest import resolve_dtype

from adasum_reference import tree
import hora


def power_of_two(size):
    return size & (size - 1) == 0




def random_input(tag, rank, count):
    rng = np.random.default_rng([zlib.crc32(tag.encode()), rank, count])
    return rng.normal(size=count)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, "bfloat16"])
def test_adasum_matches_the_reference_tree(dtype, rank, size):
    dtype = resolve_dtype(dtype)
    count = 23
    inputs = [random_input("adasum", r, count).astype(dtype) for r in range(size)]
    name = f"adasum.random.{dtype.name}"
    if not power_of_two(size):
        with pytest.raises(ValueError, match=f"power of two, got {size} ranks"):
            hora.allreduce(inputs[rank], name=name, op=hora.Adasum)
        return
    result = hora.allreduce(inputs[rank], name=name, op=hora.Adasum)
    assert result.dtype == dtype
    want = tree([x.astype(np.float64) for x in inputs])
    tolerance = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}.get(dtype, 2e-2)
    np.testing.assert_allclose(result.astype(np.float64), want, rtol=tolerance,
                               atol=tolerance)
    everyone = hora.allgather_object(result.tobytes())
    assert all(other == everyone[0] for other in everyone)  # identical bits on every rank


def test_orthogonal_vectors_add_up_and_parallel_ones_average(rank, size):
    if not power_of_two(size):
        pytest.skip("Adasum needs a power-of-two world (refusal tested above)")
    mine = np.zeros(size + 2)
    mine[rank] = rank + 1.0
    np.testing.assert_array_equal(hora.allreduce(mine, name="adasum.orthogonal", op=hora.Adasum),
                                  [r + 1.0 for r in range(size)] + [0.0, 0.0])
    same = np.array([1.5, -2.0, 0.25])
    np.testing.assert_array_equal(hora.allreduce(same, name="adasum.parallel", op=hora.Adasum),
                                  same)


def test_each_tensor_of_a_group_gets_its_own_coefficients(rank, size):
    if not power_of_two(size):
        pytest.skip("Adasum needs a power-of-two world (refusal tested above)")
    counts = (5, 1, 40)
    inputs = [[random_input("group", r, n) for r in range(size)] for n in counts]
    results = hora.grouped_allreduce([tensor[rank] for tensor in inputs], name="adasum.group",
                                     op=hora.Adasum, prescale_factor=0.5, postscale_factor=3.0)
    for result, tensor in zip(results, inputs):
        np.testing.assert_allclose(result, 3.0 * tree([0.5 * x for x in tensor]), rtol=1e-12,
                                   atol=1e-12)


def test_torch_allreduce_adasum(rank, size):
    torch = pytest.importorskip("torch")
    import hora.torch as hvd

    inputs = [torch.from_numpy(random_input("torch", r, 17)).float() for r in range(size)]
    if not power_of_two(size):
        with pytest.raises(ValueError, match="power of two"):
            hvd.allreduce(inputs[rank], name="adasum.torch", op=hvd.Adasum)
        return
    result = hvd.allreduce(inputs[rank], name="adasum.torch", op=hvd.Adasum)
    want = tree([x.double().numpy() for x in inputs])
    np.testing.assert_allclose(result.double().numpy(), want, rtol=1e-5, atol=1e-6)


def test_adasum_refuses_integers_and_reducescatter(rank, size):
    with pytest.raises(ValueError, match="op=Adasum reduces float16, bfloat16, float32 and "
                                         "float64 tensors, got int32"):
        hora.allreduce(np.arange(4, dtype=np.int32), name="adasum.int", op=hora.Adasum)
    with pytest.raises(ValueError, match="op=Adasum is an allreduce"):
        hora.reducescatter(np.ones((size, 2)), name="adasum.rs", op=hora.Adasum)
