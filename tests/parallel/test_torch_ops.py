"""hora.torch collectives on every dtype against the NumPy references, their
in-place/async/grouped variants, the runtime re-exports, and argument and
mismatch errors. Every rank makes the same calls; assertions come last."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hora  # noqa: E402
import hora.torch as hvd  # noqa: E402
from conftest import ALL_DTYPES  # noqa: E402
from hora_reference import (ALL_OPS, FLOAT_DTYPES, assert_close, assert_reduced,  # noqa: E402
                            assert_same, dtype_name, inputs_of, is_bool, op_name,
                            reduce_reference, reducescatter_block, reducescatter_rows)
from torch_helpers import to_numpy, torch_dtype, torch_input  # noqa: E402

SHAPE = (4, 3)


def ops_for(dtype):
    return [op for op in ALL_OPS if not (is_bool(dtype) and op == hora.Average)]


# --- runtime --------------------------------------------------------------------

def test_runtime_is_reexported(rank, size):
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (rank, size)
    assert 0 <= hvd.local_rank() < hvd.local_size() <= size
    assert 0 <= hvd.cross_rank() < hvd.cross_size()
    assert hvd.mpi_built() and hvd.mpi_enabled() and not hvd.gloo_built()
    assert isinstance(hvd.nccl_built(), bool) and isinstance(hvd.cuda_built(), bool)
    assert (hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 3, 4, 5)
    assert hvd.HorovodInternalError is hora.HoraInternalError
    assert hvd.HoraMismatchError is hora.HoraMismatchError


# --- allreduce ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_allreduce_every_op(dtype, rank, size):
    tag = f"torch.allreduce.{dtype_name(dtype)}"
    results = {}
    for op in ops_for(dtype):
        x = torch_input(f"{tag}.{op_name(op)}", rank, SHAPE, dtype)
        before = x.clone()
        results[op] = (hvd.allreduce(x, name=f"{tag}.{op_name(op)}", op=op), x, before)
    for op, (result, x, before) in results.items():
        expected = reduce_reference(inputs_of(f"{tag}.{op_name(op)}", range(size), SHAPE, dtype),
                                    op, dtype)
        assert result.dtype == torch_dtype(dtype) and result.shape == SHAPE
        assert_reduced(to_numpy(result), expected, op)
        assert torch.equal(x, before)


def test_allreduce_on_both_sides_of_the_small_copy_size(rank, size):
    """Out of place, small host tensors are copied into the result and
    reduced there in place, larger ones go out of place: the same results,
    the inputs untouched, a 0-d tensor and a non-contiguous one included."""
    from hora.torch._collectives import SMALL_COPY_BYTES
    tag = "torch.allreduce.small_copy"
    limit = SMALL_COPY_BYTES // 4
    shapes = {"scalar": (), "at": (limit,), "above": (limit + 1,), "wide": (2, limit)}
    inputs = {key: torch_input(f"{tag}.{key}", rank, shape, np.float32)
              for key, shape in shapes.items()}
    inputs["strided"] = inputs["wide"].t()  # (limit, 2): its copy is contiguous
    before = {key: x.clone() for key, x in inputs.items()}
    results = {key: hvd.allreduce(x, name=f"{tag}.{key}.out", op=hvd.Sum)
               for key, x in inputs.items()}
    for key, x in inputs.items():
        source = "wide" if key == "strided" else key
        expected = reduce_reference(inputs_of(f"{tag}.{source}", range(size), shapes[source],
                                              np.float32), hora.Sum, np.float32)
        if key == "strided":
            expected = expected.T
        assert results[key].shape == x.shape and results[key].is_contiguous()
        assert_same(to_numpy(results[key]), expected)
        assert torch.equal(x, before[key])


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_allreduce_inplace_and_async(dtype, rank, size):
    tag = f"torch.allreduce_variants.{dtype_name(dtype)}"
    op = hora.Max if is_bool(dtype) else hora.Sum
    inplace = torch_input(tag + ".1", rank, SHAPE, dtype)
    returned = hvd.allreduce_(inplace, name=tag + ".1", op=op)
    handle = hvd.allreduce_async(torch_input(tag + ".2", rank, SHAPE, dtype), name=tag + ".2",
                                 op=op)
    inplace_async = torch_input(tag + ".3", rank, SHAPE, dtype)
    handle_ = hvd.allreduce_async_(inplace_async, name=tag + ".3", op=op)
    result = hvd.synchronize(handle)
    returned_ = hvd.synchronize(handle_)
    polled = hvd.poll(handle) and hvd.poll(handle_)

    assert returned is inplace and returned_ is inplace_async and polled
    for suffix, actual in ((".1", inplace), (".2", result), (".3", inplace_async)):
        expected = reduce_reference(inputs_of(tag + suffix, range(size), SHAPE, dtype), op, dtype)
        assert_same(to_numpy(actual), expected)


def test_allreduce_default_op_is_average_and_deprecated_average(rank, size):
    tag = "torch.allreduce.default"
    x = torch_input(tag, rank, (5,), np.float64)
    default = hvd.allreduce(x, name=tag + ".default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        averaged = hvd.allreduce(x, average=True, name=tag + ".average")
        summed = hvd.allreduce(x, average=False, name=tag + ".sum")
    inputs = inputs_of(tag, range(size), (5,), np.float64)
    assert_reduced(to_numpy(default), reduce_reference(inputs, hora.Average, np.float64),
                   hora.Average)
    assert torch.equal(averaged, default)
    assert_same(to_numpy(summed), reduce_reference(inputs, hora.Sum, np.float64))
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(ValueError, match="not both"):
        hvd.allreduce(x, average=True, op=hvd.Sum)


def test_noncontiguous_tensors(rank, size):
    tag = "torch.noncontiguous"
    base = torch_input(tag, rank, (3, 4), np.float32)
    view = base.t()  # (4, 3), not contiguous
    assert not view.is_contiguous()
    out = hvd.allreduce(view, name=tag + ".out", op=hvd.Sum)
    target = base.clone()
    hvd.allreduce_(target.t(), name=tag + ".inplace", op=hvd.Sum)
    gathered = hvd.allgather(view, name=tag + ".gather")

    expected = reduce_reference(inputs_of(tag, range(size), (3, 4), np.float32), hora.Sum,
                                np.float32)
    assert torch.equal(out, torch.from_numpy(expected).t())
    assert torch.equal(target, torch.from_numpy(expected))
    rows = [torch.from_numpy(a).t() for a in inputs_of(tag, range(size), (3, 4), np.float32)]
    assert torch.equal(gathered, torch.cat(rows))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=dtype_name)
def test_scale_factors(dtype, rank, size):
    tag = f"torch.scale.{dtype_name(dtype)}"
    x = torch_input(tag, rank, (6,), dtype)
    summed = hvd.allreduce(x, name=tag + ".sum", op=hvd.Sum, prescale_factor=0.5,
                           postscale_factor=4.0)
    averaged = hvd.allreduce(x, name=tag + ".avg", op=hvd.Average, prescale_factor=2.0,
                             postscale_factor=0.5)
    scattered = hvd.reducescatter(torch_input(tag + ".rs", rank, (size + 1, 2), dtype),
                                  name=tag + ".rs", op=hvd.Sum, prescale_factor=2.0,
                                  postscale_factor=0.25)
    inputs = inputs_of(tag, range(size), (6,), dtype)
    assert_same(to_numpy(summed), reduce_reference(inputs, hora.Sum, dtype, 0.5, 4.0))
    assert_close(to_numpy(averaged), reduce_reference(inputs, hora.Average, dtype, 2.0, 0.5),
                 ulps=2, magnitude=2.0 * size)
    full = reduce_reference(inputs_of(tag + ".rs", range(size), (size + 1, 2), dtype), hora.Sum,
                            dtype, 2.0, 0.25)
    assert_same(to_numpy(scattered), reducescatter_block(full, rank, size))


@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compression(compression, rank, size):
    tag = f"torch.compression.{compression}"
    compressor = getattr(hvd.Compression, compression)
    x = torch_input(tag, rank, (8,), np.float32)
    result = hvd.allreduce(x, name=tag, op=hvd.Sum, compression=compressor)
    integers = hvd.allreduce(torch.arange(4), name=tag + ".int", op=hvd.Sum,
                             compression=compressor)
    compressed, ctx = compressor.compress(x)

    expected = reduce_reference(inputs_of(tag, range(size), (8,), np.float32), hora.Sum,
                                np.float32)
    assert result.dtype == torch.float32
    np.testing.assert_array_equal(result.numpy(), expected)  # halves and small sums are exact
    assert integers.tolist() == [i * size for i in range(4)]
    assert compressed.dtype == {"fp16": torch.float16, "bf16": torch.bfloat16}[compression]
    assert compressor.decompress(compressed, ctx).dtype == torch.float32
    assert hvd.Compression.none.compress(x)[0] is x


def test_grouped_allreduce_variants(rank, size):
    tag = "torch.grouped"
    spec = [(np.float32, (3, 2)), (np.int64, (5,)), ("bfloat16", (4,)), (np.float16, ()),
            (np.uint8, (2,))]

    def members(suffix):
        return [torch_input(f"{tag}{suffix}.{i}", rank, shape, dtype)
                for i, (dtype, shape) in enumerate(spec)]

    out = hvd.grouped_allreduce(members(".a"), name=tag + ".a", op=hvd.Sum)
    inplace = members(".b")
    returned = hvd.grouped_allreduce_(inplace, name=tag + ".b", op=hvd.Max)
    handle = hvd.grouped_allreduce_async(members(".c"), name=tag + ".c", op=hvd.Min)
    inplace_async = members(".d")
    handle_ = hvd.grouped_allreduce_async_(inplace_async, name=tag + ".d", op=hvd.Sum)
    asynced, asynced_ = hvd.synchronize(handle), hvd.synchronize(handle_)

    assert all(a is b for a, b in zip(returned, inplace))
    assert all(a is b for a, b in zip(asynced_, inplace_async))
    for suffix, results, op in ((".a", out, hora.Sum), (".b", inplace, hora.Max),
                                (".c", asynced, hora.Min), (".d", inplace_async, hora.Sum)):
        assert len(results) == len(spec)
        for i, ((dtype, shape), actual) in enumerate(zip(spec, results)):
            expected = reduce_reference(inputs_of(f"{tag}{suffix}.{i}", range(size), shape, dtype),
                                        op, dtype)
            assert_same(to_numpy(actual), expected)


# --- allgather, broadcast, alltoall, reducescatter ---------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_allgather_uneven(dtype, rank, size):
    tag = f"torch.allgather.{dtype_name(dtype)}"
    result = hvd.allgather(torch_input(f"{tag}.{rank}", rank, (rank + 1, 2), dtype), name=tag)
    handle = hvd.allgather_async(torch_input(tag + ".async", rank, (2, 3), dtype),
                                 name=tag + ".async")
    grouped = hvd.grouped_allgather([torch_input(tag + ".g0", rank, (rank, 2), dtype),
                                     torch_input(tag + ".g1", rank, (1,), dtype)],
                                    name=tag + ".g")
    asynced = hvd.synchronize(handle)
    grouped_async = hvd.synchronize(hvd.grouped_allgather_async(
        [torch_input(tag + ".ga", rank, (2,), dtype)], name=tag + ".ga"))

    expected = np.concatenate([to_numpy(torch_input(f"{tag}.{r}", r, (r + 1, 2), dtype))
                               for r in range(size)])
    assert result.dtype == torch_dtype(dtype)
    assert_same(to_numpy(result), expected)
    assert_same(to_numpy(asynced), np.concatenate(inputs_of(tag + ".async", range(size), (2, 3),
                                                            dtype)))
    assert_same(to_numpy(grouped[0]), np.concatenate(
        [to_numpy(torch_input(tag + ".g0", r, (r, 2), dtype)) for r in range(size)]))
    assert_same(to_numpy(grouped[1]), np.concatenate(inputs_of(tag + ".g1", range(size), (1,),
                                                               dtype)))
    assert_same(to_numpy(grouped_async[0]), np.concatenate(inputs_of(tag + ".ga", range(size),
                                                                     (2,), dtype)))


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_broadcast_variants(dtype, rank, size):
    tag = f"torch.broadcast.{dtype_name(dtype)}"
    root = size - 1
    x = torch_input(tag, rank, SHAPE, dtype)
    before = x.clone()
    out = hvd.broadcast(x, root, name=tag)
    inplace = torch_input(tag, rank, SHAPE, dtype)
    returned = hvd.broadcast_(inplace, root, name=tag + "_")
    handle = hvd.broadcast_async(x, 0, name=tag + ".async")
    inplace_async = torch_input(tag, rank, SHAPE, dtype)
    handle_ = hvd.broadcast_async_(inplace_async, 0, name=tag + ".async_")
    asynced, returned_ = hvd.synchronize(handle), hvd.synchronize(handle_)

    root_value = to_numpy(torch_input(tag, root, SHAPE, dtype))
    zero_value = to_numpy(torch_input(tag, 0, SHAPE, dtype))
    assert torch.equal(x, before) and returned is inplace and returned_ is inplace_async
    assert_same(to_numpy(out), root_value)
    assert_same(to_numpy(inplace), root_value)
    assert_same(to_numpy(asynced), zero_value)
    assert_same(to_numpy(inplace_async), zero_value)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_alltoall_variants(dtype, rank, size):
    tag = f"torch.alltoall.{dtype_name(dtype)}"
    # rank r sends (r + d) % 3 rows to rank d
    splits = [(rank + d) % 3 for d in range(size)]
    x = torch_input(f"{tag}.{rank}", rank, (sum(splits), 2), dtype)
    output, received = hvd.alltoall(x, splits=splits, name=tag)
    even = hvd.alltoall(torch_input(tag + ".even", rank, (2 * size,), dtype), name=tag + ".even")
    handle = hvd.alltoall_async(x, splits=torch.tensor(splits), name=tag + ".async")
    asynced = hvd.synchronize(handle)

    pieces = []
    for r in range(size):
        sent = [(r + d) % 3 for d in range(size)]
        rows = to_numpy(torch_input(f"{tag}.{r}", r, (sum(sent), 2), dtype))
        start = sum(sent[:rank])
        pieces.append(rows[start:start + sent[rank]])
    assert received.dtype == torch.int32
    assert received.tolist() == [(r + rank) % 3 for r in range(size)]
    assert_same(to_numpy(output), np.concatenate(pieces))
    assert isinstance(even, torch.Tensor)
    assert_same(to_numpy(even), np.concatenate(
        [a[2 * rank:2 * rank + 2] for a in inputs_of(tag + ".even", range(size), (2 * size,),
                                                     dtype)]))
    assert isinstance(asynced, tuple) and torch.equal(asynced[0], output)
    assert torch.equal(asynced[1], received)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=dtype_name)
def test_reducescatter_every_op(dtype, rank, size):
    tag = f"torch.reducescatter.{dtype_name(dtype)}"
    shape = (2 * size + 1, 2)  # uneven: the first rank gets an extra row
    results = {op: hvd.reducescatter(torch_input(f"{tag}.{op_name(op)}", rank, shape, dtype),
                                     name=f"{tag}.{op_name(op)}", op=op)
               for op in ops_for(dtype)}
    sum_op = hora.Max if is_bool(dtype) else hora.Sum
    handle = hvd.reducescatter_async(torch_input(tag + ".async", rank, shape, dtype),
                                     name=tag + ".async", op=sum_op)
    grouped = hvd.grouped_reducescatter(
        [torch_input(tag + ".g0", rank, shape, dtype), torch_input(tag + ".g1", rank, (3,), dtype)],
        name=tag + ".g", op=sum_op)
    grouped_async = hvd.synchronize(hvd.grouped_reducescatter_async(
        [torch_input(tag + ".ga", rank, shape, dtype)], name=tag + ".ga", op=sum_op))
    asynced = hvd.synchronize(handle)

    def block(suffix, op, member_shape=shape):
        full = reduce_reference(inputs_of(tag + suffix, range(size), member_shape, dtype), op,
                                dtype)
        return reducescatter_block(full, rank, size)

    for op, result in results.items():
        assert result.shape[0] == reducescatter_rows(shape[0], size)[rank]
        assert_reduced(to_numpy(result), block(f".{op_name(op)}", op), op)
    assert_same(to_numpy(asynced), block(".async", sum_op))
    assert_same(to_numpy(grouped[0]), block(".g0", sum_op))
    assert_same(to_numpy(grouped[1]), block(".g1", sum_op, (3,)))
    assert_same(to_numpy(grouped_async[0]), block(".ga", sum_op))


def test_default_reducescatter_op_is_average(rank, size):
    tag = "torch.reducescatter.default"
    x = torch_input(tag, rank, (size, 3), np.float64)
    result = hvd.reducescatter(x, name=tag)
    full = reduce_reference(inputs_of(tag, range(size), (size, 3), np.float64), hora.Average,
                            np.float64)
    assert_reduced(to_numpy(result), reducescatter_block(full, rank, size), hora.Average)


def test_barrier_join_and_objects(rank, size):
    hvd.barrier()
    last = hvd.join()
    lasts = hvd.allgather_object(last, name="torch.join.last")
    obj = hvd.broadcast_object({"rank": rank, "list": [1, 2]}, root_rank=size - 1,
                               name="torch.object")
    gathered = hvd.allgather_object(("r", rank), name="torch.objects")
    assert 0 <= last < size and lasts == [last] * size
    assert obj == {"rank": size - 1, "list": [1, 2]}
    assert gathered == [("r", r) for r in range(size)]


# --- errors -----------------------------------------------------------------------------

def test_argument_errors_are_raised_at_once(rank, size):
    x = torch.ones(4)
    with pytest.raises(TypeError, match="torch.Tensor"):
        hvd.allreduce(np.ones(3))
    with pytest.raises(ValueError, match="CPU"):
        hvd.allreduce(torch.ones(3, device="meta"))
    with pytest.raises(ValueError, match="CPU"):
        hvd.broadcast_(torch.ones(3, device="meta"), 0)
    with pytest.raises(ValueError, match="sparse|dense"):
        hvd.allreduce(torch.eye(3).to_sparse())
    with pytest.raises(TypeError, match="complex64"):
        hvd.allgather(torch.ones(3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="process set"):
        hvd.allreduce(x, process_set=object())
    with pytest.raises(ValueError, match="Adasum"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)
    with pytest.raises(ValueError, match="Average"):
        hvd.allreduce(torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="scalar"):
        hvd.allgather(torch.tensor(1.0))
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(size + 1), splits=[1] * size + [1])
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(x, size)
    with pytest.raises(ValueError, match="device must be"):
        hvd.join(device=-2)
    with pytest.raises(TypeError, match="integers"):
        hvd.alltoall(torch.ones(size), splits=[0.5] * size)
    assert hvd.allreduce(x, op=hvd.Sum, process_set=hvd.global_process_set,
                         name="torch.errors.after").tolist() == [float(size)] * 4


def test_mismatched_shapes_raise_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("a mismatch needs at least two ranks")
    errors = []
    for kind, call in (
            ("allreduce", lambda: hvd.allreduce(torch.ones(rank + 1), name="torch.mm.allreduce")),
            ("allgather", lambda: hvd.allgather(torch.ones(2, rank + 1), name="torch.mm.gather")),
            ("broadcast", lambda: hvd.broadcast(torch.ones(rank + 2), 0, name="torch.mm.bcast")),
            ("dtype", lambda: hvd.allreduce(
                torch.ones(3, dtype=torch.float32 if rank else torch.float64),
                name="torch.mm.dtype"))):
        try:
            call()
            errors.append((kind, None))
        except Exception as error:  # noqa: BLE001 - checked below, after every rank is done
            errors.append((kind, error))
    after = hvd.allreduce(torch.ones(2), name="torch.mm.after", op=hvd.Sum)
    for kind, error in errors:
        assert isinstance(error, hora.HoraMismatchError), f"{kind}: got {error!r}"
    assert after.tolist() == [float(size)] * 2
