"""What the stateful compressors (:mod:`hora.torch.powersgd`,
:mod:`hora.torch.onebit`) share: they compress ``DistributedOptimizer``'s
gradients unit by unit, with state kept between steps, and the optimizer
runs their collectives.

The protocol, per unit and step: ``round = start(named_grads, op)``; the
optimizer runs the first collective on ``round.first`` (an in-place
allreduce with ``round.first_op``, or an allgather, as
``first_collective`` says); ``tensors = second(round, gathered)`` (the
allgather's results, or None); an in-place allreduce of ``tensors`` with
``round.second_op``; ``finish(round, ranks)``; after every unit,
``end_step()``. ``reset()`` runs on every rank when an elastic world
changes.
"""

from __future__ import annotations

from hora.common.basics import Average, ReduceOp, Sum
from hora.common.compression import Compressor


class StatefulCompressor(Compressor):
    """Base of the compressors that only ``DistributedOptimizer`` can run."""

    stateful = True
    first_collective = "allreduce"
    what_travels = ""  # for messages: "two allreduces per step", ...

    def __init__(self):
        self.iteration = 0  # steps completed

    def compress(self, tensor):
        raise ValueError(f"{self!r} compresses DistributedOptimizer's gradients "
                         f"({self.what_travels} and state kept between steps); a single "
                         f"collective takes Compression.none, fp16 or bf16")

    def decompress(self, tensor, ctx):
        raise ValueError(f"{self!r} has no decompress of its own: it works inside "
                         f"DistributedOptimizer")

    def check(self, names: dict, op: ReduceOp, sharding: str | None) -> None:
        """Raises ``ValueError`` at DistributedOptimizer's construction for
        what the compressor cannot reduce."""
        if sharding:
            raise ValueError(f"DistributedOptimizer: compression={self!r} cannot be combined "
                             f"with sharding={sharding!r} (sharded gradients are "
                             f"reduce-scattered, not averaged whole)")
        if op not in (Average, Sum):
            raise ValueError(f"DistributedOptimizer: compression={self!r} averages or sums; "
                             f"op={ReduceOp(op).name} cannot be compressed that way")
        for p, name in names.items():
            if p.requires_grad and not p.dtype.is_floating_point:
                raise ValueError(f"DistributedOptimizer: compression={self!r} needs floating-"
                                 f"point gradients; parameter '{name}' is {p.dtype}")

    def end_step(self) -> None:
        """Counts a step (for the uncompressed warm-up)."""
        self.iteration += 1

    def reset(self) -> None:
        """Forgets the state and the step count (every rank at the same
        step: a new world)."""
        self.iteration = 0
