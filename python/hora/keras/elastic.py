"""``hora.keras.elastic``: the same as :mod:`hora.tensorflow.keras.elastic`."""

from hora.tensorflow.keras.elastic import *  # noqa: F401,F403
from hora.tensorflow.keras.elastic import __all__  # noqa: F401
