"""Checkpoints of the sharded optimizer: the full state dict equals the
replicated optimizer's, loads at any world size and into plain torch; the
per-rank shards round-trip and merge offline; Horovod's resume pattern
(load on the root, broadcast_optimizer_state) works."""

import io

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from hora.torch.sharded_checkpoint import consolidate_sharded_state_dicts  # noqa: E402
from sharding_helpers import assert_same, gathered, make, parameters, train  # noqa: E402

STAGES = ["optimizer_state", "gradients", "parameters"]


def assert_same_state(got, expected):
    assert got["param_groups"] == expected["param_groups"]
    assert sorted(got["state"]) == sorted(expected["state"])
    for number, entry in expected["state"].items():
        assert sorted(got["state"][number]) == sorted(entry), number
        for key, value in entry.items():
            other = got["state"][number][key]
            if isinstance(value, torch.Tensor):
                assert other.shape == value.shape, (number, key)
                torch.testing.assert_close(other, value, rtol=1e-6, atol=1e-7)
            else:
                assert other == value


def round_trip(value):
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("sharding", STAGES)
def test_full_state_dict_is_the_replicated_one(sharding, size):
    model, replicated = make()
    train(model, replicated, steps=2)
    expected = replicated.state_dict()
    model, optimizer = make(sharding=sharding)
    train(model, optimizer, steps=2)
    assert_same_state(optimizer.state_dict(), expected)


@pytest.mark.parametrize("sharding", STAGES)
def test_a_full_state_dict_resumes_at_this_world_size(sharding, size):
    """Saved from a replicated run, loaded into a sharded one (each rank
    keeps its slice), the training goes on as the replicated run does."""
    model, replicated = make()
    train(model, replicated, steps=2)
    checkpoint = round_trip({"model": model.state_dict(), "optimizer": replicated.state_dict()})
    train(model, replicated, steps=2, first_step=2)
    expected = parameters(model)

    model, optimizer = make(sharding=sharding)
    with gathered(model, writeback=True):  # stage 3's weights are whole only inside
        model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    train(model, optimizer, steps=2, first_step=2)
    assert_same(parameters(model), expected)


@pytest.mark.parametrize("sharding", STAGES)
def test_a_full_state_dict_loads_into_plain_torch(sharding, size):
    model, optimizer = make(sharding=sharding)
    train(model, optimizer, steps=2)
    full = round_trip(optimizer.state_dict())
    plain_model = type(model)()
    plain = torch.optim.Adam(plain_model.parameters(), lr=0.01)
    plain.load_state_dict(full)
    assert_same_state(plain.state_dict(), full)


@pytest.mark.parametrize("sharding", STAGES)
def test_sharded_state_dicts_round_trip_and_merge(sharding, rank, size):
    model, optimizer = make(sharding=sharding)
    train(model, optimizer, steps=2)
    full = optimizer.state_dict()
    mine = round_trip(optimizer.sharded_state_dict())
    # a shard holds 1/N of the state (every element on exactly one rank)
    elements = sum(v.numel() for entry in mine["state"].values()
                   for k, v in entry.items() if isinstance(v, torch.Tensor) and k != "step")
    total = hvd.allreduce(torch.tensor([elements]), op=hvd.Sum, name="sharding.ckpt.elements")
    assert int(total[0]) == 2 * sum(optimizer._hora_layout.numels)
    every = hvd.allgather_object(mine, name="sharding.ckpt.shards")
    assert_same_state(consolidate_sharded_state_dicts(list(reversed(every))), full)

    # back into a fresh optimizer at the same world size
    model2, optimizer2 = make(sharding=sharding)
    with gathered(model):
        weights = {k: v.clone() for k, v in model.state_dict().items()}
    with gathered(model2, writeback=True):
        model2.load_state_dict(weights)
    optimizer2.load_sharded_state_dict(mine)
    train(model, optimizer, steps=1, first_step=2)
    train(model2, optimizer2, steps=1, first_step=2)
    assert_same(parameters(model2), parameters(model), exact=True)

    if size > 1:
        other = every[(rank + 1) % size]
        with pytest.raises(ValueError, match=f"saved by rank {(rank + 1) % size} of {size}"):
            optimizer2.load_sharded_state_dict(other)
        with pytest.raises(ValueError, match="missing ranks"):
            consolidate_sharded_state_dicts(every[:-1])


def test_a_shard_of_other_parameters_is_refused(size):
    _, optimizer = make(sharding="gradients")
    saved = optimizer.sharded_state_dict()
    _, other = make(sharding="gradients", bucket_bytes=64)
    with pytest.raises(ValueError, match="cut from other parameters or buckets"):
        other.load_sharded_state_dict(saved)
    with pytest.raises(ValueError, match="load_sharded_state_dict"):
        other.load_state_dict(saved)


@pytest.mark.parametrize("sharding", STAGES)
def test_load_on_the_root_then_broadcast_optimizer_state(sharding, rank, size):
    """Horovod's resume: only rank 0 reads the checkpoint, then
    broadcast_parameters and broadcast_optimizer_state spread it."""
    model, replicated = make()
    train(model, replicated, steps=2)
    checkpoint = round_trip({"model": model.state_dict(), "optimizer": replicated.state_dict()})
    train(model, replicated, steps=2, first_step=2)
    expected = parameters(model)

    model, optimizer = make(sharding=sharding, lr=0.5)  # lr comes from the root
    if sharding == "parameters":
        # the weights are whole only inside a collective context: every
        # rank loads them there (rank 0 alone, then a broadcast inside it,
        # comes to the same)
        with gathered(model, writeback=True):
            if rank == 0:
                model.load_state_dict(checkpoint["model"])
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        if rank == 0:
            optimizer.load_state_dict(checkpoint["optimizer"])
    else:
        if rank == 0:
            model.load_state_dict(checkpoint["model"])
            optimizer.load_state_dict(checkpoint["optimizer"])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert optimizer.param_groups[0]["lr"] == 0.01
    train(model, optimizer, steps=2, first_step=2)
    assert_same(parameters(model), expected)


@pytest.mark.parametrize("sharding", STAGES)
def test_broadcast_optimizer_state_of_a_training_run_keeps_the_shards(sharding, size):
    model, optimizer = make(sharding=sharding)
    train(model, optimizer, steps=2)
    before = optimizer.state_dict()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert_same_state(optimizer.state_dict(), before)
