"""The ways ``python -m hora.bench tf-synthetic`` trains one Keras model:
hora's Keras DistributedOptimizer, hora's DistributedGradientTape in a
``tf.function`` training step, the same model with no communication,
TensorFlow's MultiWorkerMirroredStrategy, and Horovod's Keras
DistributedOptimizer. Each owns a copy of the model, all with the same
initial weights (see :mod:`hora.bench.synthetic` for the interface).

The Keras variants are compiled, take one ``model.fit`` step to build
everything, and are then timed through ``model.train_function`` on a
dataset iterator that lives as long as the variant: what ``fit`` runs per
batch, without its per-call set-up (callbacks, a new iterator), which
would otherwise weigh differently on each variant.
"""

from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from hora.bench import keras_models


class Variant:
    name = ""
    label = ""
    reason = None
    background = False
    synchronized = True

    def __init__(self, setup):
        self.setup = setup
        self.model = None

    def start(self):
        pass

    def stop(self):
        pass

    def flat_weights(self):
        return np.concatenate([np.asarray(v.numpy(), dtype=np.float64).reshape(-1)
                               for v in self.model.trainable_weights])

    def _model(self):
        keras = self.setup.keras
        model = keras_models.build(keras, self.setup.model_name, self.setup.image_size)
        model.set_weights(self.setup.initial_weights)
        return model


class KerasFit(Variant):
    """A compiled Keras model trained by its own train function."""

    strategy = None  # a tf.distribute strategy the model lives in, if any

    def _compile(self, optimizer):
        scope = self.strategy.scope() if self.strategy else contextlib.nullcontext()
        with scope:
            self.model = self._model()
            self.model.compile(optimizer=optimizer(), loss=keras_models.loss(self.setup.keras))
        data = self._dataset()
        self.model.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
        if self.strategy is not None:
            data = self.strategy.experimental_distribute_dataset(data)
        self.iterator = iter(data)
        self.train_function = self.model.train_function

    def _dataset(self, copies=1):
        x, y = self.setup.data
        if copies > 1:  # a global batch, split among the workers' replicas
            x, y = np.concatenate([x] * copies), np.concatenate([y] * copies)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.OFF
        return tf.data.Dataset.from_tensors((x, y)).repeat().with_options(options)

    def run(self, batches):
        logs = None
        for _ in range(batches):
            logs = self.train_function(self.iterator)
        _finish(logs)


def _finish(outputs):
    """Waits for the last step's results (a value read back to the host)."""
    for value in tf.nest.flatten(outputs):
        if hasattr(value, "numpy"):
            value.numpy()
            return


class Hora(KerasFit):
    name, label = "hora", "hora Keras DistributedOptimizer"

    def __init__(self, setup):
        super().__init__(setup)
        import hora.tensorflow.keras as hvd
        compression = hvd.Compression.fp16 if setup.args.fp16_allreduce else hvd.Compression.none
        self._compile(lambda: hvd.DistributedOptimizer(setup.optimizer(),
                                                       compression=compression))


class ComputeOnly(KerasFit):
    name, label = "compute_only", "compute only (no communication)"
    synchronized = False

    def __init__(self, setup):
        super().__init__(setup)
        self._compile(setup.optimizer)


class HoraTape(Variant):
    """A ``tf.function`` step with ``DistributedGradientTape``, as in
    Horovod's tensorflow2_synthetic_benchmark.py."""

    name, label = "hora_tape", "hora DistributedGradientTape (tf.function step)"

    def __init__(self, setup):
        super().__init__(setup)
        import hora.tensorflow as hvd
        compression = hvd.Compression.fp16 if setup.args.fp16_allreduce else hvd.Compression.none
        model = self.model = self._model()
        optimizer = setup.optimizer()
        loss = keras_models.loss(setup.keras)
        x, y = (tf.constant(a) for a in setup.data)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                value = loss(y, model(x, training=True))
            tape = hvd.DistributedGradientTape(tape, compression=compression)
            gradients = tape.gradient(value, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return value

        self.step = step

    def run(self, batches):
        value = None
        for _ in range(batches):
            value = self.step()
        _finish(value)


class Mwms(KerasFit):
    """tf.distribute.MultiWorkerMirroredStrategy with ``model.fit``: every
    rank a worker with one replica, collectives over its gRPC ring."""

    name, label = "mwms", "TensorFlow MultiWorkerMirroredStrategy (Keras 2, ring)"

    def __init__(self, setup):
        super().__init__(setup)
        if setup.strategy is None:
            self.reason = setup.strategy_reason
            return
        self.strategy = setup.strategy
        self._compile(setup.optimizer)

    def _dataset(self, copies=1):
        return super()._dataset(copies=self.setup.size)


class Horovod(KerasFit):
    name, label = "horovod", "Horovod Keras DistributedOptimizer"
    background = True

    def __init__(self, setup):
        super().__init__(setup)
        try:
            import horovod.tensorflow.keras as horovod
        except ImportError:
            self.reason = ("horovod.tensorflow.keras is not installed (Horovod built with "
                           "TensorFlow)")
            return
        self.horovod = horovod

    def start(self):
        horovod = self.horovod
        horovod.init()
        compression = (horovod.Compression.fp16 if self.setup.args.fp16_allreduce
                       else horovod.Compression.none)
        self._compile(lambda: horovod.DistributedOptimizer(self.setup.optimizer(),
                                                           compression=compression))

    def stop(self):
        self.horovod.shutdown()


KNOWN = {"mwms": Mwms, "hora_tape": HoraTape, "horovod": Horovod}
