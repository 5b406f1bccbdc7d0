"""The Keras hora serves is the one ``tf.keras`` hands the user, whatever was
imported first. ``from tensorflow.keras.optimizers import Optimizer`` run
before hora is imported makes ``tf.keras`` the Keras 2 module under the name
``tensorflow.keras`` when ``TF_USE_LEGACY_KERAS=1``; hora once took that
name for Keras 3 and built its callbacks on Keras 3's ``Callback``, so
``model.fit`` failed with ``AttributeError: ... no attribute
'_implements_train_batch_hooks'``.

The script runs in a process of its own (a one-process hora job, out of
this job's launcher), since the import order and the variable only count
before TensorFlow and hora are imported. The world size does not enter
into it, so only the 1-rank job of the suite runs it."""

import json
import os
import subprocess
import sys

import pytest

import hora.tensorflow as hvd

SCRIPT = r"""
from tensorflow.keras.optimizers import Optimizer  # before hora: the order that fooled it

import json

import numpy as np
import tensorflow as tf

import hora.tensorflow as hvd_tf
import hora.tensorflow.keras as hvd
from hora.tensorflow.keras import _flavor

hvd.init()
keras = tf.keras
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback(),
             hvd.callbacks.LearningRateWarmupCallback(initial_lr=0.1, warmup_epochs=1)]
keras.utils.set_random_seed(3)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
state = hvd.elastic.KerasState(model, epoch=0, batch=0)
elastic_callbacks = [hvd.elastic.CommitStateCallback(state),
                     hvd.elastic.UpdateBatchStateCallback(state),
                     hvd.elastic.UpdateEpochStateCallback(state)]
x = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)
y = np.stack([x.sum(axis=1), x[:, 0] - x[:, 2]], axis=1)
before = [w.copy() for w in model.get_weights()]
history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0,
                    callbacks=callbacks)
print("RESULT " + json.dumps({
    "tf_keras_name": tf.keras.__name__,
    "user_optimizer_module": Optimizer.__module__,
    "legacy": _flavor.LEGACY,
    "served_keras": _flavor.keras.__name__,
    "model_module": type(model).__module__,
    "callbacks_are_tf_keras_callbacks": [
        isinstance(c, keras.callbacks.Callback) for c in callbacks + elastic_callbacks],
    "sync_batch_norm_is_a_tf_keras_layer": issubclass(hvd_tf.SyncBatchNormalization,
                                                      keras.layers.BatchNormalization),
    "epochs": len(history.history["loss"]),
    "trained": any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights())),
    "lr": float(history.history["lr"][-1]),
}))
"""

# the variables that make a process a rank of this job (or of its MPI launch)
_JOB_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "PRTE_")
_JOB_VARIABLES = {f"{prefix}_{what}" for prefix in ("HORA", "HOROVOD")
                  for what in ("RANK", "SIZE", "LOCAL_RANK", "LOCAL_SIZE")}


def _script_env(legacy):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(_JOB_PREFIXES) and key not in _JOB_VARIABLES}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["TF_USE_LEGACY_KERAS"] = legacy
    return env


@pytest.mark.parametrize("legacy", ["1", "0"], ids=["keras2", "keras3"])
def test_keras_imported_before_hora_serves_the_keras_of_tf_keras(legacy, tmp_path):
    if hvd.size() > 1:
        pytest.skip("a one-process check: the suite's 1-rank job runs it")
    if legacy == "1":
        pytest.importorskip("tf_keras")
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=_script_env(legacy),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    output = done.stdout.decode(errors="replace")
    assert done.returncode == 0, output[-6000:]
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, output[-6000:]
    result = json.loads(lines[0][len("RESULT "):])
    keras2 = legacy == "1"
    # the import order this test is about: tf.keras is Keras 2 named tensorflow.keras
    assert result["tf_keras_name"] == "tensorflow.keras", result
    assert result["user_optimizer_module"].startswith("tf_keras." if keras2 else "keras."), result
    assert result["legacy"] is keras2, result
    assert result["served_keras"] == ("tf_keras" if keras2 else "keras"), result
    assert result["model_module"].startswith("tf_keras." if keras2 else "keras."), result
    assert result["callbacks_are_tf_keras_callbacks"] == [True] * 6, result
    assert result["sync_batch_norm_is_a_tf_keras_layer"] is True, result
    assert result["epochs"] == 2 and result["trained"] is True, result
    assert result["lr"] == pytest.approx(0.1), result
