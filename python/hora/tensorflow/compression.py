"""Gradient compression for TensorFlow tensors, as in Horovod.

``Compression.none`` sends tensors as they are. ``Compression.fp16`` sends
floating-point tensors as float16 (the core accumulates 16-bit floats in
float32) and casts the result back to the original dtype; other dtypes pass
through unchanged. Pass the class itself, e.g. ``compression=Compression.fp16``.
"""

import tensorflow as tf

from hora.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class FP16Compressor(Compressor):
    """Casts floating-point tensors to float16 for the wire and back."""

    @staticmethod
    def compress(tensor):
        """Casts a floating-point ``tensor`` to float16; the context is its
        original dtype. Other dtypes are returned unchanged."""
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            return tf.cast(tensor, tf.float16), dtype
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        """Casts back to the dtype recorded by :meth:`compress`."""
        if ctx is not None and tensor.dtype != ctx:
            return tf.cast(tensor, ctx)
        return tensor


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor
