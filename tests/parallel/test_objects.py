"""broadcast_object and allgather_object with picklable Python objects."""

import numpy as np
import pytest

import hora


def rich_object(rank):
    return {
        "rank": rank,
        "name": f"rank-{rank}",
        "weights": np.arange(rank * 3, dtype=np.float32).reshape(rank, 3) if rank else
        np.zeros((0, 3), np.float32),
        "nested": {"list": list(range(rank + 2)), "tuple": (rank, None, "x" * rank)},
        "ints": np.full(4, rank, np.int64),
    }


def assert_rich_equal(got, expected):
    assert set(got) == set(expected)
    assert got["rank"] == expected["rank"] and got["name"] == expected["name"]
    assert got["nested"] == expected["nested"]
    for key in ("weights", "ints"):
        assert isinstance(got[key], np.ndarray)
        assert got[key].dtype == expected[key].dtype
        np.testing.assert_array_equal(got[key], expected[key])


def test_broadcast_object_from_each_root(rank, size):
    results = [hora.broadcast_object(rich_object(rank), root_rank=root,
                                     name=f"objects.broadcast.{root}") for root in range(size)]
    for root, result in enumerate(results):
        assert_rich_equal(result, rich_object(root))


def test_broadcast_object_default_root_and_none_elsewhere(rank, size):
    # Only the root's object matters; the others may pass anything.
    obj = {"config": {"lr": 0.1, "layers": [64, 32]}, "seed": 1234} if rank == 0 else None
    result = hora.broadcast_object(obj, name="objects.broadcast.default")
    assert result == {"config": {"lr": 0.1, "layers": [64, 32]}, "seed": 1234}


def test_broadcast_object_unnamed(rank, size):
    first = hora.broadcast_object(["first", rank])
    second = hora.broadcast_object(("second", rank), root_rank=size - 1)
    assert first == ["first", 0]
    assert second == ("second", size - 1)


def test_broadcast_large_object(rank, size):
    payload = np.random.default_rng(7).integers(0, 1000, size=200_000) if rank == 0 else None
    result = hora.broadcast_object(payload, name="objects.broadcast.large")
    np.testing.assert_array_equal(result, np.random.default_rng(7).integers(0, 1000, size=200_000))


def test_allgather_object(rank, size):
    result = hora.allgather_object(rich_object(rank), name="objects.allgather")
    assert isinstance(result, list) and len(result) == size
    for r, got in enumerate(result):
        assert_rich_equal(got, rich_object(r))


def test_allgather_object_sizes_differ(rank, size):
    obj = "x" * (1000 * rank) if rank % 2 else [rank] * 5
    result = hora.allgather_object(obj, name="objects.allgather.sizes")
    assert result == ["x" * (1000 * r) if r % 2 else [r] * 5 for r in range(size)]


def test_allgather_object_unnamed_and_simple_values(rank, size):
    ints = hora.allgather_object(rank)
    nones = hora.allgather_object(None)
    assert ints == list(range(size))
    assert nones == [None] * size


def test_broadcast_object_root_out_of_range(rank, size):
    with pytest.raises(ValueError):
        hora.broadcast_object({"a": 1}, root_rank=size, name="objects.bad_root")
    # still usable afterwards, and the same name works
    assert hora.broadcast_object({"a": rank}, root_rank=0, name="objects.bad_root") == {"a": 0}


def test_objects_travel_by_cloudpickle_as_in_horovod(rank, size):
    offset = 10 * rank

    def add(x):  # a local function: plain pickle refuses it
        return x + offset

    scale = hora.broadcast_object(lambda x: 3 * x, name="objects.lambda")
    assert scale(2) == 6
    functions = hora.allgather_object(add, name="objects.local_functions")
    assert [f(1) for f in functions] == [10 * r + 1 for r in range(size)]


def test_an_object_the_root_cannot_pickle_raises_on_every_rank(rank, size):
    import pickle
    import threading
    root = size - 1
    obj = {"lock": threading.Lock()} if rank == root else None
    if rank == root:
        with pytest.raises(TypeError, match="lock"):
            hora.broadcast_object(obj, root_rank=root, name="objects.unpicklable")
    else:
        with pytest.raises(pickle.PicklingError, match=f"rank {root} could not pickle.*lock"):
            hora.broadcast_object(obj, root_rank=root, name="objects.unpicklable")
    # nothing left in flight: the same name works again
    assert hora.broadcast_object(rank, root_rank=root, name="objects.unpicklable") == root


def test_an_object_one_rank_cannot_pickle_in_allgather_raises_on_every_rank(rank, size):
    import pickle
    import threading
    bad = size - 1
    obj = threading.Lock() if rank == bad else rank
    with pytest.raises(pickle.PicklingError, match=f"of rank {bad}: TypeError: .*lock"):
        hora.allgather_object(obj, name="objects.allgather.unpicklable")
    assert hora.allgather_object(rank, name="objects.allgather.unpicklable") == list(range(size))
