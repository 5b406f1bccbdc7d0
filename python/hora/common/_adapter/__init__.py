"""What the NumPy face (:mod:`hora.common.ops`) and every framework adapter
do the same way, so that each framework only adds its tensor type.

- :mod:`~hora.common._adapter.naming`: how collectives are named and matched
  across ranks.
- :mod:`~hora.common._adapter.handles`: handles on collectives in flight, and
  waiting for several at once.
- :mod:`~hora.common._adapter.submission`: the collective kinds and every call
  that hands tensors to the compiled core.
- :mod:`~hora.common._adapter.checks`: the argument checks, one function
  and one exception class per mistake.

Internal to hora: the adapters import from here, users import from
``hora``, ``hora.torch``, ``hora.tensorflow`` or ``hora.mxnet``.
"""
