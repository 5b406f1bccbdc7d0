"""Elastic, fault-tolerant Keras training (model.fit) on handwritten digits:
Horovod's elastic Keras API with hora. Kill a rank (or all of them) and the
job resumes from its last commit; add slots and it grows.

    horarun -np 2 --min-np 1 python examples/keras/elastic_train_digits.py
See docs/elastic.md.
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hora.keras as hvd  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import build_model, load_digits_dataset  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="for one rank; scaled by size()")
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(1234)
    train_x, train_y, test_x, test_y = load_digits_dataset()
    model = build_model()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9))
    # hora's collectives run on the host; XLA cannot compile them
    model.compile(optimizer=optimizer, metrics=["accuracy"], jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    state = hvd.elastic.KerasState(model, epoch=0, batch=0)

    def on_reset():
        # the global batch follows the number of ranks, and so does the rate
        optimizer.learning_rate.assign(args.lr * hvd.size())

    state.register_reset_callbacks([on_reset])
    callbacks = [hvd.callbacks.MetricAverageCallback(),
                 hvd.elastic.UpdateEpochStateCallback(state),
                 hvd.elastic.UpdateBatchStateCallback(state),
                 hvd.elastic.CommitStateCallback(state, batches_per_commit=10)]

    @hvd.elastic.run
    def train(state):
        # each world shards the data over its own ranks
        usable = len(train_y) // hvd.size() * hvd.size()
        shard = slice(hvd.rank(), usable, hvd.size())
        if hvd.rank() == 0:
            print(f"training with {hvd.size()} rank(s) from epoch {state.epoch}", flush=True)
        model.fit(train_x[shard], train_y[shard], batch_size=args.batch_size,
                  epochs=args.epochs - state.epoch, callbacks=callbacks,
                  verbose=2 if hvd.rank() == 0 else 0)

    train(state)
    shard = slice(hvd.rank(), None, hvd.size())
    correct = (model.predict(test_x[shard], verbose=0).argmax(1) == test_y[shard]).sum()
    totals = hvd.allreduce(np.array([float(correct), float(len(test_y[shard]))]), op=hvd.Sum,
                           name="test.counts").numpy()
    if hvd.rank() == 0:
        print(f"final test accuracy {totals[0] / totals[1]:.3f}", flush=True)


if __name__ == "__main__":
    main()
