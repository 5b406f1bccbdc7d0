"""hora.mxnet inside process sets, as Horovod's ``process_set=``: the
collectives against references computed from the set members' inputs,
broadcast_parameters and the object functions in a set, DistributedTrainer
and DistributedOptimizer averaging within a set (and stepping locally
outside it), two sets using the same names at the same time, and the errors.

The ranks are split into evens and odds; each rank works in the set it
belongs to, so both sets run side by side. On one rank the evens are the
global set itself (a set with the global set's ranks cannot be added)."""

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import hora
import hora.mxnet as hvd
from conftest import rank_values
from parity_sets import other_set, parity_fixture


sets = pytest.fixture(parity_fixture, name="sets")


def test_the_mxnet_face_exports_the_process_set_api():
    assert hvd.ProcessSet is hora.ProcessSet
    assert hvd.global_process_set is hora.global_process_set
    assert hvd.add_process_set is hora.add_process_set
    assert hvd.remove_process_set is hora.remove_process_set
    for name in ("ProcessSet", "global_process_set", "add_process_set", "remove_process_set"):
        assert name in hvd.__all__


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.float64])
def test_allreduce_in_sets(rank, size, sets, dtype):
    _, _, mine = sets
    inputs = {r: rank_values("mps.allreduce", r, (3, 4), dtype) for r in mine.ranks}
    total = sum(inputs[r].astype(np.float64) for r in mine.ranks)
    name = f"mps.same.{np.dtype(dtype).name}"
    x = mx.nd.array(inputs[rank], dtype=dtype)
    # both sets use the same name at the same time; so does the global set after
    got = hvd.allreduce(x, name=name, op=hvd.Sum, process_set=mine)
    np.testing.assert_array_equal(got.asnumpy().astype(np.float64), total)
    np.testing.assert_array_equal(x.asnumpy(), inputs[rank])
    if np.dtype(dtype).kind == "f":
        average = hvd.allreduce(x, process_set=mine)
        np.testing.assert_allclose(average.asnumpy(), total / len(inputs), rtol=1e-6)
        in_place = x.copy()
        same = hvd.allreduce_(in_place, op=hvd.Max, prescale_factor=2.0, postscale_factor=0.5,
                              process_set=mine)
        assert same is in_place
        np.testing.assert_allclose(in_place.asnumpy(),
                                   np.max(np.stack(list(inputs.values())), axis=0))
    everyone = sum(rank_values("mps.allreduce", r, (3, 4), dtype).astype(np.float64)
                   for r in range(size))
    got = hvd.allreduce(x, name=name, op=hvd.Sum)
    np.testing.assert_array_equal(got.asnumpy().astype(np.float64), everyone)


def test_grouped_allreduce_in_a_set(rank, sets):
    _, _, mine = sets
    n = mine.size()
    arrays = [mx.nd.ones((k + 2,)) * (rank + k) for k in range(3)]
    results = hvd.grouped_allreduce(arrays, op=hvd.Sum, process_set=mine)
    hvd.grouped_allreduce_(arrays, name="mps.grouped", process_set=mine)
    for k in range(3):
        total = float(sum(r + k for r in mine.ranks))
        np.testing.assert_array_equal(results[k].asnumpy(), np.full(k + 2, total))
        np.testing.assert_allclose(arrays[k].asnumpy(), np.full(k + 2, total / n))


def test_allgather_broadcast_alltoall_reducescatter(rank, sets):
    _, _, mine = sets
    n, me = mine.size(), mine.rank()
    gathered = hvd.allgather(mx.nd.ones((me + 1, 2)) * rank, process_set=mine)
    want = np.concatenate([np.full((k + 1, 2), float(r)) for k, r in enumerate(mine.ranks)])
    np.testing.assert_array_equal(gathered.asnumpy(), want)

    root = mine.ranks[-1]  # a global rank
    got = hvd.broadcast(mx.nd.ones((3,)) * rank, root_rank=root, process_set=mine)
    np.testing.assert_array_equal(got.asnumpy(), np.full(3, float(root)))
    in_place = mx.nd.array([rank, rank], dtype="int64")
    hvd.broadcast_(in_place, root, name="mps.bcast", process_set=mine)
    assert in_place.asnumpy().tolist() == [root, root]

    splits = [k + 1 for k in range(n)]  # one entry per member
    rows = np.concatenate([np.full((k + 1, 2), 100 * rank + k, np.float32) for k in range(n)])
    output, received = hvd.alltoall(mx.nd.array(rows), splits=mx.nd.array(splits, dtype="int32"),
                                    process_set=mine)
    want = np.concatenate([np.full((me + 1, 2), 100 * r + me) for r in mine.ranks])
    np.testing.assert_array_equal(output.asnumpy(), want)
    assert received.asnumpy().tolist() == [me + 1] * n  # one entry per member
    even = hvd.alltoall(mx.nd.array(np.arange(2 * n) + 10 * rank), process_set=mine)
    want = np.concatenate([np.arange(2 * me, 2 * me + 2) + 10 * r for r in mine.ranks])
    np.testing.assert_array_equal(even.asnumpy(), want)

    count = 2 * n + 1  # uneven: the first members get one row more
    inputs = {r: rank_values("mps.rs", r, (count, 3)) for r in mine.ranks}
    total = sum(inputs.values())
    counts = [count // n + (1 if k < count % n else 0) for k in range(n)]
    start = sum(counts[:me])
    block = total[start:start + counts[me]]
    summed = hvd.reducescatter(mx.nd.array(inputs[rank]), op=hvd.Sum, process_set=mine)
    averaged = hvd.reducescatter(mx.nd.array(inputs[rank]), process_set=mine)
    np.testing.assert_allclose(summed.asnumpy(), block)
    np.testing.assert_allclose(averaged.asnumpy(), block / n, rtol=1e-6)


def test_a_root_outside_the_set_is_refused(rank, sets):
    outsider = other_set(sets).ranks[0]
    _, _, mine = sets
    with pytest.raises(ValueError, match=f"root rank {outsider} is not in process set"):
        hvd.broadcast(mx.nd.zeros((2,)), root_rank=outsider, name="mps.bad.root",
                      process_set=mine)


def test_barrier_objects_and_unnamed_calls(rank, size, sets):
    _, _, mine = sets
    hvd.barrier(process_set=mine)
    assert hvd.allgather_object({"r": rank}, process_set=mine) == [{"r": r} for r in mine.ranks]
    root = mine.ranks[-1]
    assert hvd.broadcast_object(("from", rank), root_rank=root, process_set=mine) == ("from", root)
    # unnamed calls count per set: the sets make different numbers of them,
    # and the global set's next unnamed call still matches on every rank
    for _ in range(len(mine.ranks) + 2 * (rank % 2)):
        hvd.allreduce(mx.nd.ones((1,)), process_set=mine)
    assert hvd.allreduce(mx.nd.ones((1,)), op=hvd.Sum).asnumpy()[0] == size


def test_broadcast_parameters_in_a_set(rank, sets):
    _, _, mine = sets
    root = mine.ranks[0]
    arg_params = {"w": mx.nd.ones((2,)) * rank, "b": mx.nd.ones((1,)) * (10 + rank)}
    hvd.broadcast_parameters(arg_params, root_rank=root, prefix="mps.", process_set=mine)
    assert arg_params["w"].asnumpy().tolist() == [root, root]
    assert arg_params["b"].asnumpy().tolist() == [10 + root]
    mx.random.seed(100 + rank)
    net = gluon.nn.Dense(4)  # in_units unknown until the first forward pass
    net.initialize(mx.init.Uniform())
    hvd.broadcast_parameters(net.collect_params(), root_rank=root, prefix="mps.deferred.",
                             process_set=mine)
    net(mx.nd.ones((2, 3)))  # initializes, then broadcasts within the set
    values = weights(net)
    for other in hvd.allgather_object(values, process_set=mine):
        for a, b in zip(other, values):
            np.testing.assert_array_equal(a, b)


BATCH = 4
STEPS = 3


def make_net(seed=9):
    mx.random.seed(seed)
    np.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(6, activation="tanh", in_units=5), gluon.nn.Dense(3, in_units=6))
    net.initialize(mx.init.Xavier())
    return net


def batch(tag, r, step):
    x = rank_values(f"{tag}.x.{step}", r, (BATCH, 5))
    y = np.abs(rank_values(f"{tag}.y.{step}", r, (BATCH,), np.int32)) % 3
    return x, y.astype(np.float32)


def weights(net):
    # in creation order: MXNet's automatic names depend on how many blocks
    # were made before, so sorting by name may pair different layers
    return [p.data().asnumpy() for p in net.collect_params().values()]


def train(net, step_with, tag, ranks_of_data):
    """SGD steps of ``step_with(batch rows)`` on the concatenated batches of
    ``ranks_of_data``."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        parts = [batch(tag, r, step) for r in ranks_of_data]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x)), mx.nd.array(y))
        loss.backward()
        step_with(len(x))


def reference_weights(tag, ranks_of_data, batch_divisor):
    reference = make_net()
    trainer = gluon.Trainer(reference.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    train(reference, lambda rows: trainer.step(batch_divisor), tag, ranks_of_data)
    return weights(reference)


def assert_weights(got, want, rtol=2e-5):
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=2e-6)


TRAINERS = {
    "trainer": lambda params, ps: hvd.DistributedTrainer(
        params, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, process_set=ps),
    "trainer_groups": lambda params, ps: hvd.DistributedTrainer(
        params, "sgd", {"learning_rate": 0.1, "momentum": 0.9}, num_groups=2,
        gradient_predivide_factor=2.0, process_set=ps),
    "trainer_fp16": lambda params, ps: hvd.DistributedTrainer(
        params, "sgd", {"learning_rate": 0.1, "momentum": 0.9},
        compression=hvd.Compression.fp16, process_set=ps),
    "optimizer": lambda params, ps: gluon.Trainer(
        params, hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9),
                                         process_set=ps), kvstore=None),
}


@pytest.mark.parametrize("kind", list(TRAINERS))
def test_training_in_a_set(rank, size, sets, kind):
    """Each set's replicas end identical and equal to one process training
    on the set's concatenated batches; the other set ends elsewhere."""
    _, _, mine = sets
    tag = f"mps.train.{kind}"
    net = make_net()
    trainer = TRAINERS[kind](net.collect_params(), mine)
    train(net, lambda rows: trainer.step(rows), tag, [rank])
    got = weights(net)
    want = reference_weights(tag, mine.ranks, BATCH * mine.size())
    assert_weights(got, want, rtol=2e-2 if kind == "trainer_fp16" else 2e-5)
    everyone = hvd.allgather_object(got)
    for r, other in enumerate(everyone):
        same = all(np.array_equal(a, b) for a, b in zip(other, got))
        assert same == (r in mine.ranks), (r, mine.ranks)


def test_hand_written_loop_with_distributed_optimizer_in_a_set(rank, sets):
    _, _, mine = sets
    tag = "mps.updater"
    net = make_net()
    params = [p for _, p in sorted(net.collect_params().items())]
    optimizer = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9,
                                                          rescale_grad=1.0 / BATCH),
                                         process_set=mine)
    updater = mx.optimizer.get_updater(optimizer)

    def update(rows):
        for i, p in enumerate(params):
            updater(i, p.grad(), p.data())
    train(net, update, tag, [rank])
    assert_weights(weights(net), reference_weights(tag, mine.ranks, BATCH * mine.size()))


def test_outside_its_set_a_trainer_steps_locally(rank, size, sets):
    """Every rank builds its trainer with the evens: the odds reduce nothing
    and step on their own gradients, still divided by the set's size (as
    Horovod's DistributedTrainer does)."""
    evens, _, _ = sets
    tag = "mps.outside"
    net = make_net()
    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": 0.1, "momentum": 0.9}, process_set=evens)
    train(net, lambda rows: trainer.step(rows), tag, [rank])
    members = evens.ranks if rank in evens.ranks else [rank]
    assert_weights(weights(net), reference_weights(tag, members, BATCH * evens.size()))


def test_a_rank_outside_the_set_is_refused(rank, sets):
    other = other_set(sets)
    ranks = ", ".join(map(str, other.ranks))
    message = rf"rank {rank}\) is not in process set {other.process_set_id} \(ranks? {ranks}\)"
    calls = [
        lambda: hvd.allreduce(mx.nd.zeros((2,)), name="mps.outsider", process_set=other),
        lambda: hvd.grouped_allreduce_([mx.nd.zeros((2,))], process_set=other),
        lambda: hvd.allgather(mx.nd.zeros((1, 2)), process_set=other),
        lambda: hvd.broadcast_(mx.nd.zeros((2,)), other.ranks[0], process_set=other),
        lambda: hvd.alltoall(mx.nd.zeros((len(other.ranks),)), process_set=other),
        lambda: hvd.reducescatter(mx.nd.zeros((len(other.ranks),)), process_set=other),
        lambda: hvd.grouped_allgather([mx.nd.zeros((1, 2))], process_set=other),
        lambda: hvd.grouped_reducescatter([mx.nd.zeros((len(other.ranks),))], process_set=other),
        lambda: hvd.barrier(process_set=other),
        lambda: hvd.allgather_object(1, process_set=other),
        lambda: hvd.broadcast_parameters({"w": mx.nd.zeros((1,))}, other.ranks[0],
                                         process_set=other),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()
    assert hvd.allreduce(mx.nd.ones((1,)), op=hvd.Sum, name="mps.after.outsider").asnumpy()[0] \
        == hvd.size()


def test_unregistered_sets_and_other_objects_are_refused(rank, size):
    # The same classes and words as every adapter (hora.common._adapter.checks).
    with pytest.raises(hora.HoraInvalidArgumentError, match="is not registered"):
        hvd.allreduce(mx.nd.ones((1,)), process_set=hvd.ProcessSet([0]))
    with pytest.raises(hora.HoraTypeError, match="must be one of hora's process sets"):
        hvd.allreduce(mx.nd.ones((1,)), process_set="evens")
    with pytest.raises(hora.HoraTypeError, match="dtype bool is not supported"):
        hvd.allreduce(mx.nd.ones((1,), dtype="bool"), name="mps.bool")
    with pytest.raises(ValueError, match="is not registered"):
        hvd.DistributedOptimizer(mx.optimizer.SGD(), process_set=hvd.ProcessSet([0]))
    for call in (lambda: hvd.broadcast_object(1, process_set=object()),
                 lambda: hvd.DistributedTrainer(make_net().collect_params(), "sgd",
                                                process_set=[0])):
        with pytest.raises(TypeError, match="process set"):
            call()


def test_two_sets_use_the_same_names_at_once(rank, size, sets):
    """Both sets run same-named collectives while the global set runs one of
    the same name; each finishes in its own set."""
    _, _, mine = sets
    for step in range(10):
        x = mx.nd.ones((257,)) * (rank * 1000 + step)
        hvd.allreduce_(x, name=f"mps.shared.{step}", op=hvd.Sum, process_set=mine)
        want = float(sum(r * 1000 + step for r in mine.ranks))
        assert x.asnumpy()[0] == want and x.asnumpy()[-1] == want
    everyone = hvd.allreduce(mx.nd.ones((4096,)), name="mps.shared.0", op=hvd.Sum)
    assert everyone.asnumpy()[0] == size
