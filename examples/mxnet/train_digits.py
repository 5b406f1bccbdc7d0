"""Data-parallel gluon training on handwritten digits with hora.mxnet.

Run on two ranks:   horarun -np 2 python examples/mxnet/train_digits.py
(in an environment with MXNet 1.9.1, which on Python 3.11 needs numpy<1.24).
A Horovod script differs only in its import (horovod.mxnet).

The data are scikit-learn's bundled 8x8 digits (nothing to download). Each
rank trains on its shard; hvd.DistributedTrainer averages the gradients,
hvd.broadcast_parameters starts every rank from rank 0's weights (the
network's shapes are inferred at the first batch, so the broadcast happens
right after that), the learning rate is scaled by the number of ranks, and
rank 0 prints progress and saves the parameters after every epoch; run
again with the same --checkpoint to resume.
"""

import argparse
import os
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import hora.mxnet as hvd


def load_digits_dataset():
    """(train_x, train_y, test_x, test_y): images (N, 1, 8, 8) in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install scikit-learn") from None
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target.astype(np.float32)
    order = np.random.default_rng(42).permutation(len(labels))
    images, labels = images[order], labels[order]
    cut = int(0.8 * len(labels))
    return images[:cut], labels[:cut], images[cut:], labels[cut:]


def build_net():
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Conv2D(16, 3, padding=1, activation="relu"),
            gluon.nn.Conv2D(32, 3, padding=1, activation="relu"),
            gluon.nn.MaxPool2D(),
            gluon.nn.Flatten(),
            gluon.nn.Dense(64, activation="relu"),
            gluon.nn.Dense(10))
    return net


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="for one rank; scaled by size()")
    parser.add_argument("--checkpoint", default="mxnet-digits.params",
                        help="written by rank 0 after each epoch; resumed from when it exists")
    args = parser.parse_args()

    hvd.init()
    mx.random.seed(1234 + hvd.rank())  # different on purpose: the broadcast fixes it
    train_x, train_y, test_x, test_y = load_digits_dataset()
    usable = len(train_y) // hvd.size() * hvd.size()  # equal shards: every rank takes as many steps
    shard = slice(hvd.rank(), usable, hvd.size())
    loader = gluon.data.DataLoader(gluon.data.ArrayDataset(train_x[shard], train_y[shard]),
                                   batch_size=args.batch_size, shuffle=True)

    net = build_net()
    start_epoch = 0
    if os.path.exists(args.checkpoint):
        net.load_parameters(args.checkpoint)
        start_epoch = hvd.broadcast_object(int(open(args.checkpoint + ".epoch").read()))
        if hvd.rank() == 0:
            print(f"resuming from {args.checkpoint} at epoch {start_epoch}")
    else:
        net.initialize(mx.init.Xavier())
    net.hybridize()
    # shapes are known only after the first batch: the broadcast waits for it
    hvd.broadcast_parameters(net.collect_params(), root_rank=0)

    trainer = hvd.DistributedTrainer(net.collect_params(), "sgd",
                                     {"learning_rate": args.lr * hvd.size(), "momentum": 0.9})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def test_accuracy():
        mine = slice(hvd.rank(), None, hvd.size())
        predictions = net(mx.nd.array(test_x[mine])).argmax(axis=1).asnumpy()
        counts = hvd.allreduce(mx.nd.array([(predictions == test_y[mine]).sum(),
                                            len(test_y[mine])]), op=hvd.Sum, name="test.counts")
        correct, total = counts.asnumpy()
        return correct / total

    for epoch in range(start_epoch, args.epochs):
        start, total_loss, batches = time.perf_counter(), 0.0, 0
        for images, labels in loader:
            with autograd.record():
                loss = loss_fn(net(images), labels)
            loss.backward()
            trainer.step(images.shape[0])
            total_loss += float(loss.mean().asscalar())
            batches += 1
        mean_loss = float(hvd.allreduce(mx.nd.array([total_loss / batches]),
                                        name="epoch.loss").asscalar())
        accuracy = test_accuracy()
        if hvd.rank() == 0:
            net.save_parameters(args.checkpoint)
            with open(args.checkpoint + ".epoch", "w") as f:
                f.write(str(epoch + 1))
            print(f"epoch {epoch + 1:2d}  loss {mean_loss:.4f}  test accuracy {accuracy:.4f}  "
                  f"({time.perf_counter() - start:.1f}s)", flush=True)
    accuracy = test_accuracy()
    if hvd.rank() == 0:
        print(f"test accuracy: {accuracy:.4f} ({hvd.size()} ranks)")


if __name__ == "__main__":
    main()
