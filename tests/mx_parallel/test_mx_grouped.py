"""hora.mxnet's grouped_allgather and grouped_reducescatter (Horovod's MXNet
signatures) and alltoall's return value, against references computed from
every rank's inputs, globally and in process sets, with their errors."""

import time

import mxnet as mx
import numpy as np
import pytest

import hora
import hora.mxnet as hvd
from conftest import rank_values
from parity_sets import parity_fixture

sets = pytest.fixture(parity_fixture, name="sets")

DTYPES = [np.uint8, np.int8, np.int32, np.int64, np.float16, np.float32, np.float64]


def blocks(rows, n):
    """(start, count) of each of ``n`` ranks' block of ``rows`` rows: the
    first ``rows % n`` get one row more."""
    counts = [rows // n + (1 if k < rows % n else 0) for k in range(n)]
    return [(sum(counts[:k]), counts[k]) for k in range(n)]


def test_the_mxnet_face_exports_them():
    for name in ("grouped_allgather", "grouped_reducescatter"):
        assert name in hvd.__all__
        assert callable(getattr(hvd, name))


# --- grouped_allgather ----------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_grouped_allgather_every_dtype(dtype, rank, size):
    tag = f"mx.gag/{np.dtype(dtype).name}"
    # ragged first dimensions (one member with none on rank 0), fixed others
    shapes = [lambda r: (r + 1, 3), lambda r: (2,), lambda r: (r % 2, 2, 2)]
    inputs = [[rank_values(f"{tag}/{i}", r, shape(r), dtype) for r in range(size)]
              for i, shape in enumerate(shapes)]
    arrays = [mx.nd.array(member[rank], dtype=dtype) for member in inputs]
    results = hvd.grouped_allgather(arrays)
    assert isinstance(results, list) and len(results) == len(arrays)
    for result, member, array, i in zip(results, inputs, arrays, range(len(arrays))):
        assert isinstance(result, mx.nd.NDArray), i
        assert result.dtype == np.dtype(dtype), i
        assert result.context == mx.cpu(), i
        np.testing.assert_array_equal(result.asnumpy(), np.concatenate(member), err_msg=str(i))
        np.testing.assert_array_equal(array.asnumpy(), member[rank])  # inputs left alone


def test_grouped_allgather_named_mixed_dtypes(rank, size):
    ints = mx.nd.array(np.arange(rank + 1) + 10 * rank, dtype="int64")
    rows = mx.nd.ones((rank + 1, 2)) * rank
    gathered_ints, gathered_rows = hvd.grouped_allgather([ints, rows], name="mx.gag.named",
                                                         priority=5)
    assert gathered_ints.dtype == np.int64 and gathered_rows.dtype == np.float32
    assert gathered_ints.asnumpy().tolist() == [v for r in range(size)
                                                for v in range(10 * r, 10 * r + r + 1)]
    np.testing.assert_array_equal(
        gathered_rows.asnumpy(),
        np.concatenate([np.full((r + 1, 2), float(r), np.float32) for r in range(size)]))


def test_grouped_allgather_member_mismatch_raises_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    good = mx.nd.ones((1, 2))
    wide = mx.nd.ones((1, rank + 1))  # gathered rows must agree in width
    with pytest.raises(hora.HoraMismatchError, match=r"shape.*'mx\.gag\.bad\.1'"):
        hvd.grouped_allgather([good, wide], name="mx.gag.bad")
    assert hvd.grouped_allgather([good], name="mx.gag.bad.after")[0].shape == (size, 2)


def test_grouped_allgather_is_one_group_with_member_names(rank, size):
    """Member i of the group named n is n.i, and it is submitted as a group:
    rank 0 gathers n.0 as a group, the others on its own, which every rank
    learns as a mismatch about the group (a plain allgather would match)."""
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    name = "mx.gag.group"
    x = mx.nd.ones((1, 2)) * rank
    error = None
    start = time.monotonic()
    try:
        if rank == 0:
            hvd.grouped_allgather([x], name=name)
        else:
            hvd.allgather(x, name=f"{name}.0")
    except hora.HoraMismatchError as caught:
        error = caught
    seconds = time.monotonic() - start
    after = hvd.grouped_allgather([x], name=name + ".after")[0]
    assert error is not None, "the group met a plain allgather of its member"
    assert f"'{name}.0'" in str(error) and "group" in str(error), str(error)
    assert seconds < 30
    np.testing.assert_array_equal(after.asnumpy(),
                                  np.repeat(np.arange(size, dtype=np.float32), 2).reshape(-1, 2))


# --- grouped_reducescatter -------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_grouped_reducescatter_sum_every_dtype(dtype, rank, size):
    tag = f"mx.grs/{np.dtype(dtype).name}"
    # rows: uneven, fewer than the ranks (empty blocks at 2+ ranks), even
    shapes = [(2 * size + 1, 3), (1,), (size, 2, 2)]
    inputs = [[rank_values(f"{tag}/{i}", r, shape, dtype) for r in range(size)]
              for i, shape in enumerate(shapes)]
    arrays = [mx.nd.array(member[rank], dtype=dtype) for member in inputs]
    results = hvd.grouped_reducescatter(arrays, op=hvd.Sum)
    assert isinstance(results, list) and len(results) == len(arrays)
    for i, (result, member, shape) in enumerate(zip(results, inputs, shapes)):
        start, count = blocks(shape[0], size)[rank]
        total = np.sum(np.stack(member).astype(np.float64), axis=0)
        assert isinstance(result, mx.nd.NDArray) and result.dtype == np.dtype(dtype), i
        assert result.shape == (count, *shape[1:]), (i, result.shape)
        np.testing.assert_array_equal(result.asnumpy().astype(np.float64),
                                      total[start:start + count], err_msg=str(i))
        np.testing.assert_array_equal(arrays[i].asnumpy(), member[rank])  # inputs left alone


def test_grouped_reducescatter_average_and_scaling(rank, size):
    shapes = [(3 * size + 2, 2), (size + 1,)]
    inputs = [[rank_values(f"mx.grs.avg/{i}", r, shape, np.float64) for r in range(size)]
              for i, shape in enumerate(shapes)]
    arrays = [mx.nd.array(member[rank], dtype="float64") for member in inputs]
    averaged = hvd.grouped_reducescatter(arrays)  # Average is the default
    scaled = hvd.grouped_reducescatter(arrays, op=hvd.Sum, name="mx.grs.scaled",
                                       prescale_factor=2.0, postscale_factor=0.25)
    for i, (member, shape) in enumerate(zip(inputs, shapes)):
        start, count = blocks(shape[0], size)[rank]
        total = np.sum(np.stack(member), axis=0)[start:start + count]
        np.testing.assert_allclose(averaged[i].asnumpy(), total / size, rtol=1e-12)
        np.testing.assert_allclose(scaled[i].asnumpy(), total * 0.5, rtol=1e-12)


def test_grouped_reducescatter_is_one_group_with_member_names(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    name = "mx.grs.group"
    x = mx.nd.ones((size,))
    error = None
    try:
        if rank == 0:
            hvd.grouped_reducescatter([x], op=hvd.Sum, name=name)
        else:
            hvd.reducescatter(x, op=hvd.Sum, name=f"{name}.0")
    except hora.HoraMismatchError as caught:
        error = caught
    after = hvd.grouped_reducescatter([x], op=hvd.Sum, name=name + ".after")[0]
    assert error is not None, "the group met a plain reducescatter of its member"
    assert f"'{name}.0'" in str(error) and "group" in str(error), str(error)
    assert after.asnumpy().tolist() == [float(size)]


def test_empty_groups_return_empty_lists(rank, size):
    assert hvd.grouped_allgather([]) == []
    assert hvd.grouped_reducescatter(()) == []
    # nothing was submitted: the next unnamed calls still match on every rank
    gathered = hvd.grouped_allgather([mx.nd.array([rank], dtype="int32")])[0]
    assert gathered.asnumpy().tolist() == list(range(size))


def test_bad_arguments_raise_at_once(rank, size):
    x = mx.nd.ones((2, 2))
    scalar = mx.nd.array(np.float32(1.0).reshape(()))
    for fn in (hvd.grouped_allgather, hvd.grouped_reducescatter):
        what = fn.__name__
        with pytest.raises(TypeError, match=f"{what}: expected a list of arrays, got a single"):
            fn(x)
        with pytest.raises(TypeError, match=rf"{what} \(array 1\): expected an mxnet.nd.NDArray"):
            fn([x, np.ones((2, 2))])
        with pytest.raises(ValueError, match=rf"{what} \(array 1\): cannot split a scalar"):
            fn([x, scalar])
        with pytest.raises(ValueError, match=rf"{what} \(array 0\): row_sparse arrays"):
            fn([x.tostype("row_sparse")])
        with pytest.raises(TypeError, match=rf"{what} \(array 0\): dtype bool is not supported"):
            fn([mx.nd.ones((2,), dtype="bool")])
        with pytest.raises(TypeError, match=f"{what}: process_set must be one of hora's"):
            fn([x], process_set=object())
        with pytest.raises(ValueError, match="is not registered"):
            fn([x], process_set=hvd.ProcessSet([0]))
    with pytest.raises(ValueError, match="unknown reduce op"):
        hvd.grouped_reducescatter([x], op=42)
    # none of those reached the other ranks
    assert hvd.allreduce(mx.nd.ones((1,)), op=hvd.Sum, name="mx.grouped.after.errors") \
        .asnumpy().tolist() == [size]


# --- alltoall's return value -------------------------------------------------------

@pytest.mark.parametrize("kind", ["list", "tuple", "ndarray", "ndarray_int64"])
def test_alltoall_with_splits_returns_output_and_received_splits(kind, rank, size):
    # rank r sends (r + d) % 3 rows to rank d: some splits are zero
    sent = [(rank + d) % 3 for d in range(size)]
    rows = np.concatenate([np.full(((rank + d) % 3, 2), 100 * rank + d, np.float32)
                           for d in range(size)]).reshape(-1, 2)
    splits = {"list": sent, "tuple": tuple(sent),
              "ndarray": mx.nd.array(sent, dtype="int32"),
              "ndarray_int64": mx.nd.array(sent, dtype="int64")}[kind]
    result = hvd.alltoall(mx.nd.array(rows), splits=splits, name=f"mx.a2a.{kind}")
    assert isinstance(result, tuple) and len(result) == 2
    output, received = result
    assert isinstance(output, mx.nd.NDArray) and isinstance(received, mx.nd.NDArray)
    assert received.dtype == np.int32 and received.shape == (size,)
    assert received.context == mx.cpu()
    assert received.asnumpy().tolist() == [(r + rank) % 3 for r in range(size)]
    want = np.concatenate([np.full(((r + rank) % 3, 2), 100 * r + rank, np.float32)
                           for r in range(size)]).reshape(-1, 2)
    np.testing.assert_array_equal(output.asnumpy(), want)


def test_alltoall_without_splits_returns_the_output_alone(rank, size):
    result = hvd.alltoall(mx.nd.array(np.arange(2 * size) + 10 * rank, dtype="int64"))
    assert isinstance(result, mx.nd.NDArray)
    want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 10 * r for r in range(size)])
    assert result.dtype == np.int64
    np.testing.assert_array_equal(result.asnumpy(), want)


# --- in process sets ---------------------------------------------------------------

def test_grouped_collectives_and_alltoall_in_sets(rank, sets):
    _, _, mine = sets
    n, me = mine.size(), mine.rank()
    tag = "mx.grouped.sets"
    # both sets use the same names at the same time
    ragged = {r: rank_values(f"{tag}.ag", r, (k + 1, 2)) for k, r in enumerate(mine.ranks)}
    ints = {r: np.array([r, -r], np.int32) for r in mine.ranks}
    got_ragged, got_ints = hvd.grouped_allgather(
        [mx.nd.array(ragged[rank]), mx.nd.array(ints[rank], dtype="int32")],
        name=f"{tag}.ag", process_set=mine)
    np.testing.assert_array_equal(got_ragged.asnumpy(),
                                  np.concatenate([ragged[r] for r in mine.ranks]))
    np.testing.assert_array_equal(got_ints.asnumpy(), np.concatenate([ints[r] for r in mine.ranks]))

    shapes = [(2 * n + 1, 3), (n,)]
    inputs = [{r: rank_values(f"{tag}.rs.{i}", r, s) for r in mine.ranks}
              for i, s in enumerate(shapes)]
    summed = hvd.grouped_reducescatter([mx.nd.array(m[rank]) for m in inputs], op=hvd.Sum,
                                       name=f"{tag}.rs", process_set=mine)
    averaged = hvd.grouped_reducescatter([mx.nd.array(m[rank]) for m in inputs],
                                         process_set=mine)
    for i, (member, shape) in enumerate(zip(inputs, shapes)):
        start, count = blocks(shape[0], n)[me]
        total = sum(member.values())[start:start + count]
        np.testing.assert_array_equal(summed[i].asnumpy(), total)
        np.testing.assert_allclose(averaged[i].asnumpy(), total / n, rtol=1e-6)

    sent = [k + 1 for k in range(n)]  # one split per member
    rows = np.concatenate([np.full((k + 1,), 100 * rank + k, np.float32) for k in range(n)])
    output, received = hvd.alltoall(mx.nd.array(rows), splits=sent, process_set=mine)
    assert received.dtype == np.int32
    assert received.asnumpy().tolist() == [me + 1] * n
    np.testing.assert_array_equal(
        output.asnumpy(), np.concatenate([np.full((me + 1,), 100 * r + me) for r in mine.ranks]))
