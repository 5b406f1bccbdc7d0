"""Data-parallel training with a custom tf.GradientTape loop and hora.

Run on two ranks:   horarun -np 2 python examples/tensorflow/train_digits.py
A Horovod script differs only in its import (horovod.tensorflow).

The training step is a tf.function: hvd.DistributedGradientTape averages
the gradients over all ranks inside the graph. After the first step every
rank takes rank 0's model and optimizer variables (hvd.broadcast_variables),
the learning rate is scaled by the number of ranks, and rank 0 prints
progress and writes a checkpoint (tf.train.Checkpoint) after every epoch;
run again with the same --checkpoint prefix to resume.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hora.tensorflow as hvd  # noqa: E402


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
    parser.add_argument("--lr", type=float, default=0.002, help="for one rank; scaled by size()")
    parser.add_argument("--checkpoint", default="tf-digits-ckpt",
                        help="checkpoint prefix written by rank 0; resumed from when it exists")
    args = parser.parse_args()

    hvd.init()
    keras.utils.set_random_seed(99 + hvd.rank())
    train_x, train_y, test_x, test_y = load_digits_dataset()
    usable = len(train_y) // hvd.size() * hvd.size()
    shard = slice(hvd.rank(), usable, hvd.size())
    dataset = (tf.data.Dataset.from_tensor_slices((train_x[shard], train_y[shard]))
               .shuffle(2048, seed=hvd.rank()).batch(args.batch_size))

    model = build_model()
    opt = keras.optimizers.Adam(args.lr * hvd.size())
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    epoch = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, epoch=epoch)
    if os.path.exists(args.checkpoint + ".index"):
        opt.build(model.trainable_variables)  # Keras optimizers restore into built variables only
        checkpoint.read(args.checkpoint).assert_consumed()
        if hvd.rank() == 0:
            print(f"resuming from {args.checkpoint} at epoch {int(epoch.numpy())}")

    def test_accuracy():
        """Every rank scores its share of the test set; the sums give the accuracy."""
        mine = slice(hvd.rank(), None, hvd.size())
        correct = (model(test_x[mine], training=False).numpy().argmax(1) == test_y[mine]).sum()
        totals = hvd.allreduce([float(correct), float(len(test_y[mine]))], op=hvd.Sum,
                               name="test.counts").numpy()
        return totals[0] / totals[1]

    @tf.function(jit_compile=False)
    def train_step(images, labels, first_step):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(images, training=True))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        if first_step:
            # after the first step the optimizer's variables exist as well
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss

    first = True
    while int(epoch.numpy()) < args.epochs:
        start, losses = time.perf_counter(), []
        for images, labels in dataset:
            losses.append(train_step(images, labels, first))
            first = False
        mean_loss = float(hvd.allreduce(tf.reduce_mean(losses), name="epoch.loss"))
        epoch.assign_add(1)
        accuracy = test_accuracy()
        if hvd.rank() == 0:
            checkpoint.write(args.checkpoint)  # overwritten every epoch
            print(f"epoch {int(epoch.numpy()):2d}  loss {mean_loss:.4f}  "
                  f"test accuracy {accuracy:.4f}  ({time.perf_counter() - start:.1f}s)", flush=True)
    accuracy = test_accuracy()
    if hvd.rank() == 0:
        print(f"test accuracy: {accuracy:.4f} ({hvd.size()} ranks)")


if __name__ == "__main__":
    main()
