"""``SyncBatchNormalization``: Keras batch normalization whose batch
statistics are computed over the batches of all ranks, as Horovod's
``horovod.tensorflow.SyncBatchNormalization``.

In training each rank's mean and mean of squares are averaged over the
ranks (one allreduce of both per call, which also carries their gradients
back to every rank), and the variance is taken from them:
``Var[x] = E[x²] − E[x]²``. Every rank is assumed to hold a batch of the
same size, as in Horovod. In inference the moving statistics are used, as
in plain batch normalization. The base class is ``tf.keras``'s
``BatchNormalization`` (Keras 3, or Keras 2 with ``TF_USE_LEGACY_KERAS=1``).
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from hora.common.basics import Sum, size
from hora.tensorflow.keras._flavor import LEGACY, keras
from hora.tensorflow.mpi_ops import allreduce


class SyncBatchNormalization(keras.layers.BatchNormalization):
    """Batch normalization over the global batch (see the module).
    ``fused`` must stay False, as Horovod requires; the other arguments
    are ``BatchNormalization``'s."""

    def __init__(self, fused: bool | None = False, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError("SyncBatchNormalization does not support fused=True.")
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        if LEGACY:
            kwargs["fused"] = fused  # Keras 3 has no fused implementation to turn off
        super().__init__(**kwargs)

    def _moments(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        mean, variance = super()._moments(*args, **kwargs)
        world = size()
        if world == 1:
            return mean, variance
        mean_of_square = variance + tf.math.square(mean)
        stacked = allreduce(tf.stack([mean, mean_of_square]), op=Sum) / world
        group_mean, group_mean_of_square = tf.unstack(stacked)
        return group_mean, group_mean_of_square - tf.math.square(group_mean)
