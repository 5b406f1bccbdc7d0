"""One-bit gradient compression with a scale and error feedback
(1-bit SGD, Seide et al. 2014; EF-signSGD, Karimireddy et al. 2019) for
``DistributedOptimizer``: ``compression=hvd.Compression.onebit()``.

Each gradient of at least ``min_elements`` elements travels as its signs,
one bit per element, and one float32 scale: with ``M`` the gradient plus
the error this rank left out the step before,

1. ``C = s * sign(M)`` with ``s = mean(|M|)`` (the scale that keeps the
   L1 norm);
2. the ranks allgather each other's bits and scales (a sum of signs is not
   a sign, so this needs an allgather rather than an allreduce);
3. every rank decodes every rank's ``C`` and averages them in rank order,
   so the result is the same on every rank;
4. this rank keeps ``M - C`` as its error.

A float32 allreduce moves about 4 bytes per element through each rank's
link (2 (N-1)/N x 4); this moves (N-1)/8. Smaller gradients (biases, norms)
are averaged as they are, in one allreduce. The first ``start_iter`` steps
average everything uncompressed. A step in which some rank's scale is not
finite (a gradient overflowed, as under ``GradScaler``) hands the
non-finite result on, for the scaler to skip the step, and every rank
starts its errors from zero again (the overflow is in them). The state
(the errors) lives in the compressor; an elastic job resets it when the
world changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hora.common.basics import Average, ReduceOp
from hora.torch.stateful_compression import StatefulCompressor

_SHIFTS = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0], dtype=torch.uint8)


def pack_signs(matrix: torch.Tensor) -> torch.Tensor:
    """One bit per element (1 where the element is >= 0), 8 to a byte, the
    first element in the highest bit, zero-padded at the end."""
    positive = matrix.reshape(-1) >= 0
    if positive.device.type == "cpu":
        return torch.from_numpy(np.packbits(positive.numpy()))
    bits = positive.to(torch.uint8)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    return (bits.view(-1, 8) << _SHIFTS.to(bits.device)).sum(dim=1, dtype=torch.uint8)


def unpack_signs(packed: torch.Tensor, count: int, dtype: torch.dtype) -> torch.Tensor:
    """+1 and -1 from :func:`pack_signs`' bytes: the first ``count`` of
    each row (``packed`` is one row, or one row per rank)."""
    rows = packed if packed.dim() > 1 else packed.view(1, -1)
    if rows.device.type == "cpu":
        bits = torch.from_numpy(np.unpackbits(rows.numpy(), axis=1, count=count))
    else:
        bits = ((rows.unsqueeze(-1) >> _SHIFTS.to(rows.device)) & 1).view(rows.shape[0], -1)
        bits = bits[:, :count]
    signs = bits.to(dtype).mul_(2).sub_(1)
    return signs if packed.dim() > 1 else signs.view(-1)


class _Signs:
    """One gradient compressed in a round, and where its bits sit in the
    unit's packed bytes."""

    __slots__ = ("grad", "error", "scale", "offset", "nbytes")

    def __init__(self, grad, error, scale, offset, nbytes):
        self.grad, self.error, self.scale = grad, error, scale
        self.offset, self.nbytes = offset, nbytes


class _Round:
    """One unit's reduction: the allgather of its packed bits and scales
    first (two tensors, whatever the number of gradients), then an
    allreduce of the gradients sent as they are."""

    __slots__ = ("signs", "plain", "op", "first")
    first_op = None  # an allgather has no op

    def __init__(self, signs, plain, op, first):
        self.signs, self.plain, self.op, self.first = signs, plain, op, first

    @property
    def second_op(self) -> ReduceOp:
        return self.op


class OneBit(StatefulCompressor):
    """The one-bit compressor; make one with
    ``hvd.Compression.onebit(start_iter=10)``."""

    first_collective = "allgather"  # then an allreduce of the small gradients
    what_travels = "an allgather"

    def __init__(self, start_iter: int = 10, min_elements: int = 1024):
        for label, value, low in (("start_iter", start_iter, 0), ("min_elements", min_elements, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Compression.onebit: {label} must be an int >= {low}, got "
                                 f"{value!r}")
        self.start_iter = start_iter
        self.min_elements = min_elements
        super().__init__()
        self._errors: dict[str, torch.Tensor] = {}

    def __repr__(self):
        return f"Compression.onebit(start_iter={self.start_iter}, min_elements={self.min_elements})"

    def reset(self) -> None:
        """Forgets the errors and the step count (a new world)."""
        super().reset()
        self._errors.clear()

    def start(self, named_grads: list[tuple[str, torch.Tensor]], op: ReduceOp) -> _Round:
        signs, plain, packed, scales, offset = [], [], [], [], 0
        with torch.no_grad():
            for name, grad in named_grads:
                if (self.iteration < self.start_iter or grad.is_sparse
                        or grad.numel() < self.min_elements):
                    plain.append(grad)
                    continue
                error = self._errors.get(name)
                if (error is None or error.shape != grad.shape or error.dtype != grad.dtype
                        or error.device != grad.device):
                    error = self._errors[name] = torch.zeros_like(grad)
                error.add_(grad)  # M = gradient + error, kept where the error lives
                scales.append(error.abs().mean().to(torch.float32))
                packed.append(pack_signs(error))
                signs.append(_Signs(grad, error, scales[-1], offset, packed[-1].numel()))
                offset += packed[-1].numel()
        first = [torch.cat(packed), torch.stack(scales)] if signs else []
        return _Round(signs, plain, op, first)

    def second(self, round_: _Round, gathered: Any = None) -> list[torch.Tensor]:
        """After the allgather (``gathered``: every rank's packed bits, then
        every rank's scales): decodes and averages every rank's signs into
        each gradient, keeps this rank's errors; returns the gradients to
        allreduce as they are."""
        if round_.signs:
            all_bits, all_scales = gathered
            ranks = all_scales.numel() // len(round_.signs)
            per_rank_bits = all_bits.view(ranks, -1)
            per_rank_scales = all_scales.view(ranks, -1)
            # every rank's scales, the same on every rank: so is this
            finite = bool(torch.isfinite(all_scales).all())
            with torch.no_grad():
                for i, s in enumerate(round_.signs):
                    dtype = s.grad.dtype
                    # every rank's signs times its scale, summed in rank
                    # order: the same sum on every rank
                    decoded = unpack_signs(per_rank_bits[:, s.offset:s.offset + s.nbytes],
                                           s.grad.numel(), dtype)
                    total = (decoded * per_rank_scales[:, i:i + 1].to(dtype)).sum(dim=0)
                    # this rank's own C = scale * sign(M), as it was packed
                    scale = s.scale.to(dtype)
                    if finite:
                        s.error.sub_(torch.where(s.error >= 0, scale, -scale))  # M - C
                    else:
                        s.error.zero_()
                    if round_.op == Average:
                        total.div_(ranks)
                    s.grad.copy_(total.view_as(s.grad))
        return round_.plain

    def finish(self, round_: _Round, ranks: int) -> None:
        """Nothing left: :meth:`second` wrote the compressed gradients and
        the allreduce the others."""
