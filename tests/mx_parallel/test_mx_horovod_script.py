"""The body of Horovod's MXNet gluon example (mxnet_mnist.py) with only the
import changed and synthetic data instead of the MNIST download."""

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import hora.mxnet as hvd


def conv_nets():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(channels=8, kernel_size=5, activation="relu"))
    net.add(gluon.nn.MaxPool2D(pool_size=2, strides=2))
    net.add(gluon.nn.Flatten())
    net.add(gluon.nn.Dense(32, activation="relu"))
    net.add(gluon.nn.Dense(10))
    return net


def get_data_label(batch, ctx):
    data = batch.data[0].as_in_context(ctx)
    label = batch.label[0].as_in_context(ctx)
    return data, label


def test_horovod_mxnet_mnist_body():
    hvd.init()
    context = mx.cpu(hvd.local_rank())
    rng = np.random.default_rng(hvd.rank())
    labels = rng.integers(0, 10, size=256).astype(np.float32)
    images = (rng.random((256, 1, 16, 16)) * 0.3 + labels[:, None, None, None] / 10.0)
    train_data = mx.io.NDArrayIter(images.astype(np.float32), labels, batch_size=32, shuffle=True)

    model = conv_nets()
    model.cast("float32")
    model.hybridize()
    optimizer_params = {"momentum": 0.9, "learning_rate": 0.01 * hvd.size()}
    opt = mx.optimizer.create("sgd", **optimizer_params)
    initializer = mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2)
    model.initialize(initializer, ctx=context)
    params = model.collect_params()
    if params is not None:
        hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, opt, gradient_predivide_factor=1.0)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    metric = mx.metric.Accuracy()

    start = None
    for _epoch in range(3):
        train_data.reset()
        metric.reset()
        for batch in train_data:
            data, label = get_data_label(batch, context)
            with autograd.record():
                output = model(data.astype("float32", copy=False))
                loss = loss_fn(output, label)
            loss.backward()
            trainer.step(32)
            metric.update([label], [output])
            if start is None:  # the weights after the first step
                start = hvd.broadcast_object(
                    [p.data().asnumpy() for _, p in sorted(params.items())], root_rank=0)

    weights = [p.data().asnumpy() for _, p in sorted(params.items())]
    for other in hvd.allgather_object(weights):
        for a, b in zip(other, weights):
            np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in zip(weights, start))
