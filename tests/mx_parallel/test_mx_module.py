"""DistributedOptimizer with MXNet's Module API (no kvstore): every rank ends
with the same weights, equal to one process training on the concatenated
batches."""

import mxnet as mx
import numpy as np

import hora.mxnet as hvd

BATCH = 4
STEPS = 3


def make_module(batch):
    data = mx.sym.Variable("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=6, name="fc1")
    out = mx.sym.FullyConnected(mx.sym.Activation(hidden, act_type="tanh"), num_hidden=3,
                                name="fc2")
    net = mx.sym.SoftmaxOutput(out, name="softmax")
    module = mx.mod.Module(net, data_names=["data"], label_names=["softmax_label"],
                           context=mx.cpu())
    module.bind(data_shapes=[("data", (batch, 5))], label_shapes=[("softmax_label", (batch,))])
    mx.random.seed(21)
    module.init_params(mx.init.Xavier())
    return module


def train(module, optimizer, batches):
    module.init_optimizer(kvstore=None, optimizer=optimizer)
    for x, y in batches:
        module.forward(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(y)]), is_train=True)
        module.backward()
        module.update()
    arg_params, _ = module.get_params()
    return {name: value.asnumpy() for name, value in sorted(arg_params.items())}


def test_module_with_distributed_optimizer_matches_single_process(rank, size):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(size, STEPS * BATCH, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=(size, STEPS * BATCH)).astype(np.float32)
    mine = [(x[rank, i * BATCH:(i + 1) * BATCH], y[rank, i * BATCH:(i + 1) * BATCH])
            for i in range(STEPS)]
    # SoftmaxOutput's gradient is the per-sample one: rescale by the batch
    opt = hvd.DistributedOptimizer(mx.optimizer.SGD(learning_rate=0.1, momentum=0.9,
                                                    rescale_grad=1.0 / BATCH))
    got = train(make_module(BATCH), opt, mine)

    together = [(np.concatenate(list(x[:, i * BATCH:(i + 1) * BATCH])),
                 np.concatenate(list(y[:, i * BATCH:(i + 1) * BATCH]))) for i in range(STEPS)]
    want = train(make_module(BATCH * size),
                 mx.optimizer.SGD(learning_rate=0.1, momentum=0.9,
                                  rescale_grad=1.0 / (BATCH * size)), together)
    for other in hvd.allgather_object(got):
        for name in got:
            np.testing.assert_array_equal(other[name], got[name])
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=2e-5, atol=2e-6)
