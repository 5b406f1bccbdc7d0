"""``hora.torch.compile``: ``torch.compile`` with the compiled graph cut
where DistributedOptimizer's gradient buckets end.

A compiled model's backward pass is one autograd node: every gradient is
handed over when the whole compiled backward returns, so the gradient hooks
that start DistributedOptimizer's allreduces all fire at its end and none
of them overlaps the backward. Cutting the forward graph into pieces whose
parameters fill one bucket each (walking the graph from its end, as the
backward produces gradients) gives each piece its own backward node: the
gradients of the last piece are ready, and their bucket's allreduce is on
its way, while the backward of the pieces before it still runs. The cut is
the one PyTorch makes for DDP (``torch._dynamo.backends.distributed
.DDPOptimizer``), driven by hora's bucket sizes; each piece is compiled by
the backend the caller chose.
"""

from __future__ import annotations

import functools

import torch

from hora import _C


class _BucketCut:
    """A Dynamo backend: splits the graph after every ``bucket_bytes`` of
    parameters, counted from its end, and compiles each piece with
    ``inner``. DistributedOptimizer's first bucket is smaller (1 MiB), but
    the cut does not follow it there: each cut costs the fusion across it
    (on the CPU about a fifth of ResNet-20's step), and a piece holding
    only the last 1 MiB of parameters leaves the allreduce little backward
    to overlap."""

    def __init__(self, inner, bucket_bytes):
        from torch._dynamo.backends.distributed import DDPOptimizer
        self.inner = inner
        self.bucket_bytes = bucket_bytes
        self.compiler_name = f"hora_buckets({getattr(inner, 'compiler_name', inner)})"
        self._splitter = DDPOptimizer(bucket_bytes_cap=bucket_bytes, backend_compile_fn=inner,
                                      first_bucket_cap=bucket_bytes)

    def __call__(self, gm, example_inputs, **configs):
        return self._splitter.compile_fn(gm, example_inputs, **configs)

    def reset(self):
        if hasattr(self.inner, "reset"):
            self.inner.reset()


def _inner_backend(backend, mode, options, dynamic):
    """What ``torch.compile(backend=..., mode=..., options=...)`` would
    compile with."""
    if backend is None or backend == "inductor":
        return torch._TorchCompileInductorWrapper(mode, options, dynamic)
    return torch._TorchCompileWrapper(backend, mode, options, dynamic)


def compile(model=None, *, bucket_bytes: int | None = None, backend="inductor",
            mode: str | None = None, options: dict | None = None, dynamic: bool | None = None,
            **kwargs):
    """``torch.compile`` for models trained with ``DistributedOptimizer``,
    so that gradient allreduces overlap the compiled backward pass.

    Takes ``torch.compile``'s arguments (``fullgraph``, ``dynamic``,
    ``backend``, ``mode``, ``options``, ...) and returns what it returns,
    also as a decorator. The graph Dynamo captures is cut after every
    ``bucket_bytes`` of parameters, counted from its end (default:
    DistributedOptimizer's bucket size, ``HORA_GRADIENT_BUCKET_BYTES``,
    25 MiB), and each piece is compiled by ``backend``; a model with fewer
    parameters than that is compiled whole. Plain ``torch.compile`` works
    too, with every allreduce starting after the whole backward.
    ``bucket_bytes=0`` compiles the graph whole.

    Example::

        model = hvd.compile(model)            # instead of torch.compile(model)
        opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    """
    if model is None:
        return functools.partial(compile, bucket_bytes=bucket_bytes, backend=backend,
                                 mode=mode, options=options, dynamic=dynamic, **kwargs)
    if bucket_bytes is None:
        bucket_bytes = _C.gradient_bucket_bytes()
    elif isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 0:
        raise ValueError(f"hora.torch.compile: bucket_bytes must be an int >= 0, got "
                         f"{bucket_bytes!r}")
    if bucket_bytes == 0:
        return torch.compile(model, backend=backend, mode=mode, options=options,
                             dynamic=dynamic, **kwargs)
    if mode is not None and options is not None:
        raise RuntimeError("hora.torch.compile: either mode or options can be given, not both "
                           "(as torch.compile)")
    inner = _inner_backend(backend, mode, options, dynamic)
    return torch.compile(model, backend=_BucketCut(inner, bucket_bytes), dynamic=dynamic,
                         **kwargs)
