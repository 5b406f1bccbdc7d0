"""Misuse found at the call site raises ValueError or TypeError at once, on
the calling rank, before anything is sent. Every rank makes the same bad
call here, then a good collective shows that nothing was left behind."""

import numpy as np
import pytest

import hora
from hora_reference import assert_same


def check_usable(name, size):
    result = hora.allreduce(np.full(2, 1, np.int64), name=name, op=hora.Sum)
    assert_same(result, np.full(2, size, np.int64))


def capture(call):
    """The exception ``call`` raises, or None."""
    try:
        call()
    except Exception as error:  # noqa: BLE001 - checked by the caller
        return error
    return None


def test_duplicate_name_in_flight(rank, size):
    # A collective stays in flight until every rank has submitted it. Each
    # rank in turn holds one open while the others wait at a gate that the
    # holder only reaches after trying to reuse the name, so the name is
    # certainly still in flight when the holder reuses it.
    if size == 1:
        pytest.skip("needs another rank to keep a collective in flight")
    name = "errors.duplicate"
    outcomes, rejections = [], []
    for holder in range(size):
        held = f"{name}.{holder}.1"
        if rank == holder:
            pending = hora.allreduce_async(np.full(3, rank, np.int32), name=held, op=hora.Sum)
            # errors are collected, not raised here, so this rank always
            # reaches the gate that the others are waiting at
            rejections.append(capture(lambda held=held: hora.allreduce_async(
                np.full(3, rank, np.int32), name=held, op=hora.Sum)))
            rejections.append(capture(lambda held=held: hora.allgather(  # another kind, same name
                np.full(3, rank, np.int32), name=held)))
            rejections.append(capture(lambda holder=holder: hora.grouped_allreduce(
                # the group's second member would be named f"{name}.{holder}.1"
                [np.zeros(2, np.float32), np.zeros(2, np.float32)], name=f"{name}.{holder}",
                op=hora.Sum)))
            hora.allreduce(np.zeros(1, np.int8), name=f"{name}.{holder}.gate", op=hora.Sum)
            outcomes.append(hora.synchronize(pending))
        else:
            hora.allreduce(np.zeros(1, np.int8), name=f"{name}.{holder}.gate", op=hora.Sum)
            outcomes.append(hora.allreduce(np.full(3, rank, np.int32), name=held, op=hora.Sum))
    # the names are free again, including the rejected group's
    group = hora.grouped_allreduce([np.ones(2, np.float32), np.ones(2, np.float32)],
                                   name=f"{name}.0", op=hora.Sum)
    for outcome in outcomes:
        assert_same(outcome, np.full(3, size * (size - 1) // 2, np.int32))
    for result in group:
        assert_same(result, np.full(2, size, np.float32))
    assert len(rejections) == 3
    for rejection in rejections:
        assert isinstance(rejection, ValueError), f"expected ValueError, got {rejection!r}"
        assert "already in flight" in str(rejection)


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64, np.complex64,
                                   np.complex128, np.longdouble, object, "U3"],
                         ids=lambda d: np.dtype(d).name)
def test_unsupported_dtype(dtype, rank, size):
    x = np.zeros(3, dtype=dtype)
    calls = [
        lambda: hora.allreduce(x, name="errors.dtype", op=hora.Sum),
        lambda: hora.allgather(x, name="errors.dtype"),
        lambda: hora.broadcast(x, 0, name="errors.dtype"),
        lambda: hora.alltoall(x, splits=[3] + [0] * (size - 1), name="errors.dtype"),
        lambda: hora.reducescatter(x, name="errors.dtype", op=hora.Sum),
    ]
    if dtype is not object:
        calls.append(lambda: hora.allreduce_(x, name="errors.dtype", op=hora.Sum))
    for call in calls:
        with pytest.raises((TypeError, ValueError)):
            call()
    check_usable("errors.dtype", size)


def test_non_contiguous_input(rank, size):
    base = np.zeros((4, 6), np.float32)
    strided = base[:, ::2]
    fortran = np.asfortranarray(np.zeros((3, 4), np.float32))
    for bad in (strided, fortran, base[::2]):
        assert not bad.flags.c_contiguous
        with pytest.raises(ValueError, match="contiguous"):
            hora.allreduce(bad, name="errors.strided", op=hora.Sum)
        with pytest.raises(ValueError, match="contiguous"):
            hora.allreduce_(bad, name="errors.strided", op=hora.Sum)
        with pytest.raises(ValueError, match="contiguous"):
            hora.allgather(bad, name="errors.strided")
        with pytest.raises(ValueError, match="contiguous"):
            hora.broadcast_(bad, 0, name="errors.strided")
    check_usable("errors.strided", size)


def test_read_only_array(rank, size):
    x = np.full(4, rank, np.float32)
    x.setflags(write=False)
    for call in (lambda: hora.allreduce_(x, name="errors.readonly", op=hora.Sum),
                 lambda: hora.allreduce_async_(x, name="errors.readonly", op=hora.Sum),
                 lambda: hora.broadcast_(x, 0, name="errors.readonly"),
                 lambda: hora.broadcast_async_(x, 0, name="errors.readonly"),
                 lambda: hora.grouped_allreduce_([np.zeros(2, np.float32), x],
                                                 name="errors.readonly", op=hora.Sum)):
        with pytest.raises(ValueError, match="read-only"):
            call()
    # Out-of-place collectives only read their input: a read-only array is fine.
    reduced = hora.allreduce(x, name="errors.readonly", op=hora.Sum)
    grouped = hora.grouped_allreduce([np.zeros(2, np.float32), x], name="errors.readonly",
                                     op=hora.Sum)
    gathered = hora.allgather(x, name="errors.readonly.allgather")
    broadcast = hora.broadcast(x, size - 1, name="errors.readonly.broadcast")
    rows = np.full((size, 2), rank, np.float32)
    rows.setflags(write=False)
    exchanged, _ = hora.alltoall(rows, name="errors.readonly.alltoall")
    scattered = hora.reducescatter(rows, name="errors.readonly.reducescatter", op=hora.Sum)
    assert_same(reduced, np.full(4, size * (size - 1) // 2, np.float32))
    assert_same(grouped[1], reduced)
    assert_same(gathered, np.repeat(np.arange(size, dtype=np.float32), 4))
    assert_same(broadcast, np.full(4, size - 1, np.float32))
    assert_same(exchanged, np.repeat(np.arange(size, dtype=np.float32), 2).reshape(size, 2))
    assert_same(scattered, np.full((1, 2), size * (size - 1) // 2, np.float32))


def test_not_an_array_for_inplace(rank, size):
    with pytest.raises(TypeError):
        hora.allreduce_([1.0, 2.0], name="errors.list", op=hora.Sum)
    # the out-of-place variant accepts anything NumPy can turn into an array
    result = hora.allreduce([1.0, 2.0], name="errors.list", op=hora.Sum)
    assert_same(result, np.array([1.0, 2.0]) * size)


def test_root_rank_out_of_range(rank, size):
    x = np.zeros(3, np.float32)
    for root in (size, size + 5, -1):
        with pytest.raises(ValueError, match="root"):
            hora.broadcast(x, root, name="errors.root")
        with pytest.raises(ValueError, match="root"):
            hora.broadcast_(x, root, name="errors.root")
        with pytest.raises(ValueError, match="root"):
            hora.broadcast_async(x, root, name="errors.root")
    check_usable("errors.root", size)


def test_alltoall_bad_splits(rank, size):
    x = np.zeros((size, 2), np.float32)
    name = "errors.alltoall"
    with pytest.raises(ValueError, match="splits"):
        hora.alltoall(x, splits=[1] * (size + 1), name=name)  # too many entries
    if size > 1:
        with pytest.raises(ValueError, match="splits"):
            hora.alltoall(x, splits=[size], name=name)  # too few entries
    with pytest.raises(ValueError, match="negative"):
        hora.alltoall(x, splits=[-1] + [1] * (size - 1), name=name)
    with pytest.raises(ValueError, match="Sum of splits entries is greater than the first "
                                         "dimension of tensor .*sum to"):
        hora.alltoall(x, splits=[1] * (size - 1) + [2], name=name)  # sums to size + 1
    check_usable(name, size)


def test_alltoall_first_dim_not_divisible(rank, size):
    if size == 1:
        pytest.skip("every first dimension divides by one rank")
    with pytest.raises(ValueError, match="divisible"):
        hora.alltoall(np.zeros((size + 1, 2), np.float32), name="errors.divisible")
    check_usable("errors.divisible", size)


@pytest.mark.parametrize("kind", ["allgather", "alltoall", "reducescatter"])
def test_scalar_needs_a_dimension(kind, rank, size):
    x = np.array(1.0, np.float32)
    name = f"errors.scalar.{kind}"
    with pytest.raises(ValueError):
        if kind == "allgather":
            hora.allgather(x, name=name)
        elif kind == "alltoall":
            hora.alltoall(x, name=name)
        else:
            hora.reducescatter(x, name=name, op=hora.Sum)
    if kind == "alltoall":
        with pytest.raises(ValueError):
            hora.alltoall(x, splits=[0] * size, name=name)
    check_usable(name, size)


def test_average_on_bool(rank, size):
    x = np.zeros(3, np.bool_)
    with pytest.raises(ValueError, match="Average"):
        hora.allreduce(x, name="errors.bool_average", op=hora.Average)
    with pytest.raises(ValueError, match="Average"):
        hora.allreduce(x, name="errors.bool_average")  # the default op
    with pytest.raises(ValueError, match="Average"):
        hora.reducescatter(np.zeros((size, 2), np.bool_), name="errors.bool_average")
    with pytest.raises(ValueError, match="Average"):
        hora.grouped_allreduce([np.zeros(2, np.float32), x], name="errors.bool_average")
    check_usable("errors.bool_average", size)


@pytest.mark.parametrize("dtype", [np.bool_], ids=lambda d: np.dtype(d).name)
def test_scale_factors_refuse_bool(dtype, rank, size):
    # integers are scaled as Horovod scales them (test_scaling.py); bools cannot be
    x = np.zeros(4, dtype)
    name = f"errors.scale.{np.dtype(dtype).name}"
    with pytest.raises(ValueError, match="scale"):
        hora.allreduce(x, name=name, op=hora.Sum, prescale_factor=2.0)
    with pytest.raises(ValueError, match="scale"):
        hora.allreduce(x, name=name, op=hora.Sum, postscale_factor=0.5)
    with pytest.raises(ValueError, match="scale"):
        hora.reducescatter(np.zeros((size, 2), dtype), name=name, op=hora.Sum,
                           prescale_factor=2.0)
    # factors of exactly 1.0 are no scaling at all
    result = hora.allreduce(np.ones(4, dtype), name=name, op=hora.Sum, prescale_factor=1.0,
                            postscale_factor=1.0)
    expected = np.ones(4, dtype) if dtype is np.bool_ else np.full(4, size, dtype)
    assert_same(result, expected)


def test_adasum_and_unknown_ops(rank, size):
    x = np.ones(4, np.float32)
    with pytest.raises(ValueError, match="Adasum"):  # Adasum is for floating types
        hora.allreduce(np.ones(4, np.int32), name="errors.op", op=hora.Adasum)
    with pytest.raises(ValueError, match="Adasum"):
        hora.reducescatter(np.ones((size, 1), np.float32), name="errors.op", op=hora.Adasum)
    for bad in (7, -1, "sum"):
        with pytest.raises(ValueError):
            hora.allreduce(x, name="errors.op", op=bad)
    # plain integers with Horovod's numbering are accepted
    result = hora.allreduce(x, name="errors.op", op=1)
    assert_same(result, np.full(4, size, np.float32))


def test_name_must_be_a_string(rank, size):
    with pytest.raises(TypeError):
        hora.allreduce(np.ones(2, np.float32), name=5)
    with pytest.raises(TypeError):
        hora.broadcast(np.ones(2, np.float32), 0, name=b"bytes")
    with pytest.raises(ValueError):
        hora.allreduce(np.ones(2, np.float32), name="")
    check_usable("errors.name", size)


def test_failed_group_leaves_nothing_behind(rank, size):
    # The second member is rejected, so the first must not have been
    # submitted either: the same names work right away.
    name = "errors.group_partial"
    readonly = np.zeros(2, np.float32)
    readonly.setflags(write=False)
    with pytest.raises(ValueError):
        hora.grouped_allreduce_([np.zeros(3, np.float32), readonly], name=name, op=hora.Sum)
    with pytest.raises(TypeError):
        hora.grouped_allreduce([np.zeros(3, np.float32), np.zeros(2, np.uint32)], name=name,
                               op=hora.Sum)
    results = hora.grouped_allreduce([np.ones(3, np.float32), np.ones(2, np.float32)],
                                     name=name, op=hora.Sum)
    assert_same(results[0], np.full(3, size, np.float32))
    assert_same(results[1], np.full(2, size, np.float32))



def test_error_classes_are_importable_from_hora(size):
    # The classes the docs name are hora's own names, as Horovod's are.
    from hora.common import exceptions
    assert hora.HoraInvalidArgumentError is exceptions.HoraInvalidArgumentError
    assert hora.HoraTypeError is exceptions.HoraTypeError
    with pytest.raises(hora.HoraInvalidArgumentError, match="root_rank"):
        hora.broadcast(np.zeros(2), root_rank=size + 1, name="call_errors.bad_root")
    with pytest.raises(hora.HoraTypeError):
        hora.allreduce(np.zeros(2, np.complex64), name="call_errors.bad_dtype")
    check_usable("call_errors.after_classes", size)


def test_a_call_refused_on_one_rank_fails_on_every_rank_at_once(rank, size):
    """The refusing rank raises its own error; the ranks that made the call
    correctly raise too, naming that rank and its reason, instead of waiting
    for it (the stall inspector would report them only after minutes); the
    job stays usable. Also for a name the response cache already knows, and
    for a grouped call with one bad member."""
    if size == 1:
        pytest.skip("needs a second rank to wait")
    last = size - 1
    good = np.ones(3)
    for attempt in range(3):  # a fresh name, then twice a name the cache holds
        name = "call_errors.refused.root"
        if attempt == 0:
            hora.broadcast(good, root_rank=0, name=name)  # now in the response cache
        error = capture(lambda name=name: hora.broadcast(
            good, root_rank=size + 4 if rank == last else 0, name=name))
        assert isinstance(error, hora.HoraInvalidArgumentError), error
        if rank == last:
            assert f"root_rank {size + 4} is out of range" in str(error)
        else:
            assert str(error).startswith(f"rank {last} refused its call: broadcast '{name}': "
                                         f"root_rank {size + 4} is out of range"), str(error)
        check_usable(f"call_errors.refused.after.{attempt}", size)
    members = [np.ones(2), np.ones(2, np.complex64) if rank == last else np.ones(2)]
    error = capture(lambda: hora.grouped_allreduce(members, name="call_errors.refused.group",
                                                   op=hora.Sum))
    assert isinstance(error, (hora.HoraTypeError, hora.HoraInvalidArgumentError)), error
    if rank != last:
        assert f"rank {last} refused its call: tensor 'call_errors.refused.group.1' has " \
               f"unsupported element" in str(error)
    check_usable("call_errors.refused.after.group", size)
