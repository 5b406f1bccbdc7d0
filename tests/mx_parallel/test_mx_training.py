"""gluon training with DistributedTrainer and a hand-written loop with
DistributedOptimizer end with identical weights on every rank, equal to
single-process training on the concatenated batches."""

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import hora.mxnet as hvd
from hora.common import ops

BATCH = 4
STEPS = 3


def make_net(seed, in_units=5):
    mx.random.seed(seed)
    np.random.seed(seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, activation="tanh", in_units=in_units),
            gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    return net


def rank_data(size):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(size, STEPS * BATCH, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=(size, STEPS * BATCH)).astype(np.float32)
    return x, y


def global_batch(x, y, step):
    rows = slice(step * BATCH, (step + 1) * BATCH)
    return np.concatenate(list(x[:, rows])), np.concatenate(list(y[:, rows]))


def weights(net):
    return [p.data().asnumpy() for _, p in sorted(net.collect_params().items())]


def assert_same_on_every_rank(values):
    for other in hvd.allgather_object(values):
        for a, b in zip(other, values):
            np.testing.assert_array_equal(a, b)


def assert_matches(net, reference, rtol=2e-5):
    for got, want in zip(weights(net), weights(reference)):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=2e-6)


def train_reference(reference, x, y, size, loss_fn):
    trainer = gluon.Trainer(reference.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9}, kvstore=None)
    for step in range(STEPS):
        gx, gy = global_batch(x, y, step)
        with autograd.record():
            loss = loss_fn(reference(mx.nd.array(gx)), mx.nd.array(gy))
        loss.backward()
        trainer.step(BATCH * size)


def train_with(trainer_factory, rank, size, seed=9, broadcast=False, rtol=2e-5):
    """Trains on every rank's batches with the trainer ``trainer_factory``
    makes, and checks the weights against one process on the global batch.
    With ``broadcast`` the ranks start from different weights and
    broadcast_parameters equalizes them."""
    x, y = rank_data(size)
    net = make_net(seed=seed + rank if broadcast else seed)
    if broadcast:
        hvd.broadcast_parameters(net.collect_params(), root_rank=0)
    trainer = trainer_factory(net.collect_params())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x[rank, rows])), mx.nd.array(y[rank, rows]))
        loss.backward()
        trainer.step(BATCH)
    reference = make_net(seed=seed)
    train_reference(reference, x, y, size, loss_fn)
    assert_same_on_every_rank(weights(net))
    assert_matches(net, reference, rtol=rtol)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_distributed_trainer_matches_single_process(compression, rank, size):
    train_with(lambda params: hvd.DistributedTrainer(
        params, "sgd", {"learning_rate": 0.1, "momentum": 0.9},
        compression=getattr(hvd.Compression, compression)),
        rank, size, seed=1, broadcast=True, rtol=2e-5 if compression == "none" else 2e-2)


def test_distributed_optimizer_in_a_hand_written_loop(rank, size):
    x, y = rank_data(size)
    net = make_net(seed=5)
    params = [p for _, p in sorted(net.collect_params().items())]
    optimizer = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9,
                                                          rescale_grad=1.0 / BATCH))
    updater = mx.optimizer.get_updater(optimizer)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    for step in range(STEPS):
        rows = slice(step * BATCH, (step + 1) * BATCH)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(x[rank, rows])), mx.nd.array(y[rank, rows]))
        loss.backward()
        for i, p in enumerate(params):
            updater(i, p.grad(), p.data())
    reference = make_net(seed=5)
    train_reference(reference, x, y, size, loss_fn)
    assert_same_on_every_rank(weights(net))
    assert_matches(net, reference)


def test_broadcast_parameters_with_deferred_initialization(rank, size):
    mx.random.seed(100 + rank)
    net = gluon.nn.Dense(4)  # in_units unknown until the first forward pass
    net.initialize(mx.init.Uniform())
    hvd.broadcast_parameters(net.collect_params(), root_rank=size - 1, prefix="deferred.")
    net(mx.nd.ones((2, 3)))  # initializes, then broadcasts
    values = weights(net)
    everyone = hvd.allgather_object(values)
    for other in everyone:
        for a, b in zip(other, everyone[size - 1]):
            np.testing.assert_array_equal(a, b)
    if size > 1:
        assert not np.array_equal(everyone[0][1], make_uniform_weight(100))


def make_uniform_weight(seed):
    mx.random.seed(seed)
    net = gluon.nn.Dense(4)
    net.initialize(mx.init.Uniform())
    net(mx.nd.ones((2, 3)))
    return net.weight.data().asnumpy()


def test_broadcast_parameters_of_a_dict_and_errors(rank, size):
    arg_params = {"w": mx.nd.ones((2,)) * rank, "b": mx.nd.ones((1,)) * (10 + rank)}
    hvd.broadcast_parameters(arg_params, root_rank=0)
    assert arg_params["w"].asnumpy().tolist() == [0, 0]
    assert arg_params["b"].asnumpy().tolist() == [10]
    with pytest.raises(TypeError, match="ParameterDict or a dict"):
        hvd.broadcast_parameters([1, 2])
    with pytest.raises(TypeError, match="wraps an mx.optimizer.Optimizer"):
        hvd.DistributedOptimizer("sgd")
    with pytest.raises(ValueError, match="gradient_predivide_factor must be positive"):
        hvd.DistributedTrainer(make_net(0).collect_params(), "sgd",
                               gradient_predivide_factor=0)


def test_broadcast_parameters_of_a_dict_of_parameters(rank, size):
    """dict(net.collect_params()) (MXNet 2's collect_params returns a dict):
    Parameter values, a deferred one included, as Horovod takes them; and
    a deferred parameter initialized again is broadcast again."""
    mx.random.seed(200 + rank)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(3, in_units=2), gluon.nn.Dense(2))  # the second one deferred
    net.initialize(mx.init.Uniform())
    hvd.broadcast_parameters(dict(net.collect_params()), root_rank=0, prefix="plain.")
    net(mx.nd.ones((1, 2)))
    first = weights(net)
    assert_same_on_every_rank(first)
    mx.random.seed(300 + rank)
    net.initialize(mx.init.Uniform(), force_reinit=True)
    again = weights(net)
    everyone = hvd.allgather_object(again)
    # the deferred layer's weight and bias came from rank 0 again; the
    # other layer's were not (nothing hooks an initialized parameter)
    names = sorted(net.collect_params().keys())
    deferred = [names.index(net[1].weight.name), names.index(net[1].bias.name)]
    for other in everyone:
        for i in deferred:
            np.testing.assert_array_equal(other[i], everyone[0][i])


def test_horovods_private_names(rank, size):
    calls = []

    class Counting(hvd.DistributedOptimizer):
        def _do_allreduce(self, index, grad):
            calls.append(index)
            super()._do_allreduce(index, grad)

    optimizer = Counting(mx.optimizer.SGD(learning_rate=1.0))
    weight, grad = mx.nd.zeros((2,)), mx.nd.ones((2,)) * (rank + 1)
    optimizer.update(0, weight, grad, optimizer.create_state(0, weight))
    assert calls == [0]
    mean = sum(r + 1 for r in range(size)) / size
    np.testing.assert_allclose(weight.asnumpy(), [-mean, -mean])
    trainer = hvd.DistributedTrainer(make_net(0).collect_params(), "sgd", prefix="p.",
                                     gradient_predivide_factor=2.0, num_groups=1)
    assert (trainer._prefix, trainer._gradient_predivide_factor, trainer._num_groups) == \
        ("p.", 2.0, 1)
    assert trainer._compression is hvd.Compression.none
    assert trainer._process_set is hvd.global_process_set


def test_a_name_that_is_not_a_string_counts_as_none(rank, size):
    # Horovod's MXNet ops take any name and use only strings
    total = hvd.allreduce(mx.nd.ones((2,)) * (rank + 1), name=7, op=hvd.Sum)
    assert total.asnumpy().tolist() == [sum(range(1, size + 1))] * 2
    gathered = hvd.grouped_allgather([mx.nd.ones((1,)) * rank], name=("a", 1))
    assert gathered[0].asnumpy().tolist() == list(range(size))
    from hora.mxnet import mpi_ops
    assert mpi_ops.rank() == rank and mpi_ops.size() == size and mpi_ops.is_initialized()
    assert mpi_ops.handle_average_backwards_compatibility(None, None) == hvd.Average


def test_plain_trainer_with_distributed_optimizer(rank, size):
    # the Horovod pattern gluon.Trainer(params, hvd.DistributedOptimizer(opt)):
    # the trainer's rescale_grad must reach the wrapped optimizer
    train_with(lambda params: gluon.Trainer(
        params, hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9)),
        kvstore=None), rank, size)


def test_distributed_trainer_given_a_distributed_optimizer(rank, size):
    with pytest.warns(UserWarning, match="wrapper is removed"):
        train_with(lambda params: hvd.DistributedTrainer(
            params, hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9))),
            rank, size)


def test_num_groups_splits_gradients_into_contiguous_blocks(rank, size, monkeypatch):
    """As Horovod's split_list does: 5 gradients in 2 groups are [0, 1, 2]
    and [3, 4] (not every other gradient), the same as in torch and
    TensorFlow."""
    seen = []
    grouped = ops.grouped_allreduce_async_

    def spy(tensors, name=None, *args, **kwargs):
        seen.append((name, len(tensors)))
        return grouped(tensors, name, *args, **kwargs)
    monkeypatch.setattr(ops, "grouped_allreduce_async_", spy)
    optimizer = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.0), num_groups=2)
    grads = [mx.nd.ones((2,)) * (rank + 1 + i) for i in range(5)]
    weights = [mx.nd.zeros((2,)) for _ in grads]
    states = [optimizer.create_state(i, w) for i, w in enumerate(weights)]
    optimizer.update(list(range(5)), weights, grads, states)
    if size > 1:  # one rank has nothing to reduce
        assert seen == [("optimizer.grad.0.group", 3), ("optimizer.grad.3.group", 2)]
    for i, grad in enumerate(grads):
        np.testing.assert_array_equal(grad.asnumpy(),
                                      np.full(2, sum(r + 1 + i for r in range(size))))


def test_gradient_mistakes_are_worded_as_in_torch_and_tensorflow():
    """The sentences tests/unit/test_gradient_policy.py expects from torch,
    TensorFlow and Keras."""
    def message(call):
        with pytest.raises((ValueError, TypeError)) as caught:
            call()
        return str(caught.value)
    params = make_net(0).collect_params()
    assert message(lambda: hvd.DistributedTrainer(params, "sgd", gradient_predivide_factor=0)) \
        == "DistributedTrainer: gradient_predivide_factor must be positive, got 0.0"
    assert message(lambda: hvd.DistributedOptimizer(mx.optimizer.SGD(), num_groups=-1)) \
        == "DistributedOptimizer: the number of groups must not be negative, got -1"
    assert message(lambda: hvd.DistributedTrainer(params, "sgd", compression=object)) == (
        "DistributedTrainer: compression must be one of the framework's Compression members "
        "(Compression.none, Compression.fp16, ...) or a class with compress and decompress, "
        "got <class 'object'>")
