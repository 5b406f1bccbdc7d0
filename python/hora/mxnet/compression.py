"""Gradient compression for MXNet NDArrays, as in Horovod.

``Compression.none`` sends arrays as they are; ``Compression.fp16`` sends
floating-point arrays as float16 (the core accumulates float16 in float32)
and casts the result back. Pass the class itself.
"""

import numpy as np

from hora.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class FP16Compressor(Compressor):
    """Casts floating-point arrays to float16 for the wire and back."""

    @staticmethod
    def compress(tensor):
        """A float16 copy of a floating-point ``tensor`` (context: its dtype);
        other arrays are returned as they are."""
        dtype = np.dtype(tensor.dtype)
        if dtype.kind == "f" and dtype != np.float16:
            return tensor.astype("float16"), dtype
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Casts back to the dtype recorded by :meth:`compress`."""
        if ctx is not None:
            return tensor.astype(ctx)
        return tensor


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
