"""The framework-independent half of gradient compression: the interface
every adapter's compressors follow, and the compressor that does nothing.
Each adapter adds its casting compressors (``hora.torch.compression``,
``hora.tensorflow.compression``, ``hora.mxnet.compression``)."""


class Compressor:
    """Interface of a compressor: both methods are static, so the class
    itself (not an instance) is what gets passed around, as in Horovod."""

    @staticmethod
    def compress(tensor):
        """Returns ``(compressed_tensor, context)``; ``context`` is whatever
        :meth:`decompress` needs to restore the original."""
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        """Restores a tensor produced by :meth:`compress` (after the
        collective) using the ``ctx`` that ``compress`` returned."""
        raise NotImplementedError


class NoneCompressor(Compressor):
    """Leaves tensors untouched (``compress`` returns the same object)."""

    @staticmethod
    def compress(tensor):
        """Returns ``(tensor, None)``."""
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        """Returns ``tensor``."""
        return tensor
