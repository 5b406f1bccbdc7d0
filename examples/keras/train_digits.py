"""Data-parallel Keras training (model.fit) on handwritten digits with hora.

Run on two ranks:   horarun -np 2 python examples/keras/train_digits.py
A Horovod script differs only in its import (horovod.tensorflow.keras).

Each rank fits on its shard of the training set; hvd.DistributedOptimizer
averages the gradients, the learning rate is scaled by the number of ranks
(as the global batch is) and warmed up over the first epochs, the callbacks
start every rank from rank 0's weights and average the metrics, and only
rank 0 prints progress and writes the checkpoint. Run again with the same
--checkpoint to resume from it.
"""

import argparse
import math
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hora.tensorflow.keras as hvd  # noqa: E402


def load_digits_dataset():
    """(train_x, train_y, test_x, test_y): images (N, 8, 8, 1) in [0, 1]."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install scikit-learn") from None
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(42).permutation(len(labels))
    images, labels = images[order], labels[order]
    cut = int(0.8 * len(labels))
    return images[:cut], labels[:cut], images[cut:], labels[cut:]


def build_model():
    return keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="for one rank; scaled by size()")
    parser.add_argument("--warmup-epochs", type=int, default=2)
    parser.add_argument("--checkpoint", default="keras-digits.keras",
                        help="written by rank 0 after each epoch; resumed from when it exists")
    args = parser.parse_args()
    if not args.checkpoint.endswith(".keras"):
        parser.error("--checkpoint must end in .keras (Keras's model format)")

    hvd.init()
    keras.utils.set_random_seed(1234 + hvd.rank())  # different on purpose: the broadcast fixes it
    train_x, train_y, test_x, test_y = load_digits_dataset()
    usable = len(train_y) // hvd.size() * hvd.size()  # equal shards: every rank takes as many steps
    train_x, train_y = train_x[:usable], train_y[:usable]
    shard = slice(hvd.rank(), None, hvd.size())
    verbose = 1 if hvd.rank() == 0 else 0

    lr = args.lr * hvd.size()
    initial_epoch = 0
    if os.path.exists(args.checkpoint):
        model = hvd.load_model(args.checkpoint)   # the optimizer comes back wrapped
        steps_per_epoch = math.ceil(len(train_y[shard]) / args.batch_size)
        initial_epoch = hvd.broadcast_object(
            int(model.optimizer.iterations.numpy()) // steps_per_epoch)
        if verbose:
            print(f"resuming from {args.checkpoint} at epoch {initial_epoch}")
    else:
        model = build_model()
        opt = hvd.DistributedOptimizer(keras.optimizers.SGD(lr, momentum=0.9))
        # hora's collectives run on the host; XLA cannot compile them
        model.compile(optimizer=opt, metrics=["accuracy"], jit_compile=False,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=args.warmup_epochs,
                                                 verbose=verbose),
    ]
    if hvd.rank() == 0:
        callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint))

    model.fit(train_x[shard], train_y[shard], batch_size=args.batch_size, epochs=args.epochs,
              initial_epoch=initial_epoch, callbacks=callbacks, verbose=verbose,
              validation_data=(test_x[shard], test_y[shard]))

    # every rank scores its share of the test set; the sums give the accuracy
    correct = (model.predict(test_x[shard], verbose=0).argmax(1) == test_y[shard]).sum()
    totals = hvd.allreduce([float(correct), float(len(test_y[shard]))], op=hvd.Sum,
                           name="test.counts").numpy()
    if verbose:
        print(f"test accuracy: {totals[0] / totals[1]:.4f} "
              f"({int(totals[1])} images, {hvd.size()} ranks)")


if __name__ == "__main__":
    main()
