"""``import hora.keras as hvd``: the same API as :mod:`hora.tensorflow.keras`
(for the Keras ``tf.keras`` is), under Horovod's ``horovod.keras`` name."""

from hora.tensorflow.keras import *  # noqa: F401,F403
from hora.tensorflow.keras import __all__  # noqa: F401
