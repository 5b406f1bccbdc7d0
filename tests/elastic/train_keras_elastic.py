"""A small elastic Keras run (model.fit inside hvd.elastic.run) for the
elastic tests: per-rank data made from the rank only, SGD with momentum,
a commit at the end of every epoch.

HORA_TEST_FAULT="<launch>:<rank>:<epoch>:<batch>" SIGKILLs rank <rank> of
launch <launch> before that batch. At the end every rank saves its weights
to HORA_TEST_OUT.rank<N>.npz.
"""

import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import hora.keras as hvd  # noqa: E402

EPOCHS, STEPS, BATCH = 4, 6, 16

hvd.init()
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"),
                          keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)),
              loss="mse")
rng = np.random.default_rng(hvd.rank())
x = rng.normal(size=(STEPS * BATCH, 8)).astype("float32")
y = x.sum(axis=1, keepdims=True)
state = hvd.elastic.KerasState(model, epoch=0, batch=0)
launch = os.environ.get("HORA_ELASTIC_RESTARTS", "0")
fault = os.environ.get("HORA_TEST_FAULT", "")


class Fault(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if not fault:
            return
        when, rank, epoch, at = fault.split(":")
        if (when, int(rank), int(epoch), int(at)) == (launch, hvd.rank(), state.epoch, batch):
            os.kill(os.getpid(), signal.SIGKILL)


callbacks = [hvd.elastic.UpdateEpochStateCallback(state),
             hvd.elastic.UpdateBatchStateCallback(state),
             hvd.elastic.CommitStateCallback(state, batches_per_commit=1000), Fault()]


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"keras world of {hvd.size()} from epoch {state.epoch}", flush=True)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS - state.epoch, shuffle=False, verbose=0,
              callbacks=callbacks)


train(state)
out = os.environ.get("HORA_TEST_OUT")
if out:
    np.savez(f"{out}.rank{hvd.rank()}.npz", *[w.numpy() for w in model.weights])
