"""Gradient compression applied around a collective.

A compressor turns a tensor into the form that travels between ranks and
back. ``Compression.none`` sends tensors as they are; ``Compression.fp16``
and ``Compression.bf16`` send floating-point tensors as 16-bit floats (the
reduction accumulates in float32 for CPU tensors on one host, and sends
halves rounded once per hop on the ring between hosts; NCCL reduces CUDA tensors
in 16 bits, as Horovod does) and restore the
original dtype afterwards. Non-floating-point tensors pass through
unchanged.
"""

import torch

from hora.common.compression import Compressor, NoneCompressor  # noqa: F401 (re-exported)


class _CastCompressor(Compressor):
    wire_dtype = None

    @classmethod
    def compress(cls, tensor):
        """Casts a floating-point ``tensor`` to the wire dtype; the context is
        the original dtype. Other dtypes are returned as they are."""
        dtype = tensor.dtype
        if dtype.is_floating_point and dtype != cls.wire_dtype:
            return tensor.to(cls.wire_dtype), dtype
        return tensor, dtype

    @classmethod
    def decompress(cls, tensor, ctx):
        """Casts back to the dtype recorded by :meth:`compress`."""
        if ctx is not None and tensor.dtype != ctx:
            return tensor.to(ctx)
        return tensor


class FP16Compressor(_CastCompressor):
    """Sends floating-point tensors as ``torch.float16``. Values beyond
    float16's range (about 65504) overflow to infinity; scale first if needed."""

    wire_dtype = torch.float16


class BF16Compressor(_CastCompressor):
    """Sends floating-point tensors as ``torch.bfloat16`` (float32's range,
    8 bits of mantissa)."""

    wire_dtype = torch.bfloat16


class Compression:
    """The available compressors: ``Compression.none``, ``Compression.fp16``
    and ``Compression.bf16`` (classes, as in Horovod), and
    ``Compression.powersgd(...)`` and ``Compression.onebit(...)``, which
    make stateful compressors for ``DistributedOptimizer``
    (:mod:`hora.torch.powersgd`, :mod:`hora.torch.onebit`)."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

    @staticmethod
    def powersgd(rank: int = 1, start_iter: int = 10, min_compression_rate: float = 2.0,
                 error_feedback: bool = True, seed: int = 0):
        """A new PowerSGD compressor (low rank ``rank``, error feedback, an
        uncompressed warm-up of ``start_iter`` steps) for one
        ``DistributedOptimizer``; see :mod:`hora.torch.powersgd`."""
        from hora.torch.powersgd import PowerSGD
        return PowerSGD(rank, start_iter, min_compression_rate, error_feedback, seed)

    @staticmethod
    def onebit(start_iter: int = 10, min_elements: int = 1024):
        """A new one-bit compressor (signs and a scale, error feedback, an
        uncompressed warm-up of ``start_iter`` steps) for one
        ``DistributedOptimizer``; see :mod:`hora.torch.onebit`."""
        from hora.torch.onebit import OneBit
        return OneBit(start_iter, min_elements)
