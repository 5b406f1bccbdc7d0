"""PowerSGD gradient compression (Vogels et al., 2019) for
``DistributedOptimizer``: ``compression=hvd.Compression.powersgd(rank=1)``.

Each gradient with a matrix shape ``(n, m)`` (a tensor of more dimensions
is read as ``(shape[0], the rest)``) travels as two thin matrices of rank
``r``: per step, with ``M`` the gradient plus the error this rank left out
the step before (error feedback),

1. ``P = M Q``, averaged over the ranks (``Q``, ``m x r``, is the previous
   step's, the same on every rank: a warm start);
2. ``P`` orthonormalized (Gram-Schmidt), the same on every rank;
3. ``Q = M^T P``, averaged over the ranks;
4. the gradient becomes ``P Q^T`` (the same on every rank) and this rank
   keeps ``M - P Q^T`` as its error for the next step.

So ``(n + m) r`` numbers cross the wire instead of ``n m``. Vectors (biases,
norms) and matrices that would not shrink by ``min_compression_rate`` are
averaged as they are, in the same collective as the ``P`` matrices. For
the first ``start_iter`` steps every gradient is averaged uncompressed.

A step whose ``Q`` comes back non-finite (a gradient overflowed on some
rank, as under ``GradScaler``) hands the non-finite result on, for the
scaler to skip the step, and keeps ``Q`` and the errors as they were; a
column of ``Q`` that comes back all zero (a gradient that was zero on every
rank) is drawn afresh, so that the gradient is not stuck at zero. Both
decisions are taken on the averaged ``Q``, the same on every rank.

The state (``Q`` and the errors, per gradient) lives in the compressor
object: use one ``Compression.powersgd(...)`` per optimizer. It is not part
of the optimizer's ``state_dict``; an elastic job resets it whenever the
world changes (the errors are this rank's own, and a new world starts from
the same ``Q`` everywhere).
"""

from __future__ import annotations

import zlib
from typing import Any

import torch

from hora.common.basics import Average, ReduceOp, Sum
from hora.torch.stateful_compression import StatefulCompressor

_EPSILON = 1e-8


def _orthonormalize(matrix: torch.Tensor) -> None:
    """Gram-Schmidt on the columns of ``matrix``, in place (a zero column
    stays zero rather than dividing by nothing)."""
    for i in range(matrix.shape[1]):
        column = matrix[:, i:i + 1]
        column.div_(column.norm() + _EPSILON)
        if i + 1 < matrix.shape[1]:
            rest = matrix[:, i + 1:]
            rest.sub_(column * (column * rest).sum(dim=0, keepdim=True))


def _seeded(seed: int, m: int, rank: int, like: torch.Tensor) -> torch.Tensor:
    """A random ``m x rank`` matrix drawn from ``seed`` (the same on every
    rank), of ``like``'s dtype and device."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(m, rank, generator=generator, dtype=torch.float64)
    return q.to(dtype=like.dtype, device=like.device)


class _Matrix:
    """One gradient compressed in a round: its matrix ``M`` (gradient plus
    error), its ``P`` and the ``Q`` that will travel."""

    __slots__ = ("grad", "state", "matrix", "p", "q")

    def __init__(self, grad, state, matrix, p):
        self.grad, self.state, self.matrix, self.p = grad, state, matrix, p
        self.q = None


class _Round:
    """One unit's reduction in a step: its compressed gradients, those sent
    as they are, and what the first allreduce carries."""

    __slots__ = ("matrices", "plain", "first_op", "op")

    def __init__(self, matrices, plain, first_op, op):
        self.matrices, self.plain, self.first_op, self.op = matrices, plain, first_op, op

    @property
    def first(self) -> list[torch.Tensor]:
        return [m.p for m in self.matrices] + self.plain

    second_op = Average  # the Q matrices


class PowerSGD(StatefulCompressor):
    """The PowerSGD compressor; make one with
    ``hvd.Compression.powersgd(rank=1, start_iter=10)``."""

    what_travels = "two allreduces per step"

    def __init__(self, rank: int = 1, start_iter: int = 10, min_compression_rate: float = 2.0,
                 error_feedback: bool = True, seed: int = 0):
        for label, value, low in (("rank", rank, 1), ("start_iter", start_iter, 0),
                                  ("seed", seed, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"Compression.powersgd: {label} must be an int >= {low}, got "
                                 f"{value!r}")
        if (isinstance(min_compression_rate, bool)
                or not isinstance(min_compression_rate, (int, float))
                or not min_compression_rate >= 1):
            raise ValueError(f"Compression.powersgd: min_compression_rate must be a number >= 1, "
                             f"got {min_compression_rate!r}")
        self.rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.error_feedback = bool(error_feedback)
        self.seed = seed
        super().__init__()
        self._state: dict[str, dict[str, Any]] = {}  # gradient name -> q, error

    def __repr__(self):
        return (f"Compression.powersgd(rank={self.rank}, start_iter={self.start_iter}, "
                f"min_compression_rate={self.min_compression_rate:g}, "
                f"error_feedback={self.error_feedback})")

    def reset(self) -> None:
        """Forgets ``Q``, the errors and the step count (every rank must do
        it at the same step: a new world, for instance)."""
        super().reset()
        self._state.clear()

    # --- one unit's reduction -------------------------------------------------

    def _shape(self, grad: torch.Tensor) -> tuple[int, int] | None:
        """The matrix shape ``grad`` is compressed as, or None to send it
        as it is."""
        if self.iteration < self.start_iter or grad.dim() < 2 or grad.is_sparse:
            return None
        n = grad.shape[0]
        m = grad.numel() // n if n else 0
        rank = min(self.rank, n, m)
        if rank == 0 or n * m < self.min_compression_rate * (n + m) * rank:
            return None
        return n, m

    def _state_of(self, name: str, grad: torch.Tensor, n: int, m: int) -> dict[str, Any]:
        state = self._state.get(name)
        rank = min(self.rank, n, m)
        if (state is None or state["q"].shape != (m, rank) or state["q"].dtype != grad.dtype
                or state["q"].device != grad.device):
            # the same Q on every rank: seeded by the gradient's name
            seed = self.seed ^ zlib.crc32(name.encode())
            state = {"q": _seeded(seed, m, rank, grad), "seed": seed,
                     "error": torch.zeros(n, m, dtype=grad.dtype, device=grad.device)}
            self._state[name] = state
        return state

    def start(self, named_grads: list[tuple[str, torch.Tensor]], op: ReduceOp) -> _Round:
        """A unit's round: computes each compressed gradient's ``P``. The
        caller allreduces ``round.first`` in place with ``round.first_op``
        (the ``P`` matrices and the gradients sent as they are), then calls
        :meth:`second`."""
        matrices, plain = [], []
        with torch.no_grad():
            for grad_name, grad in named_grads:
                shape = self._shape(grad)
                if shape is None:
                    plain.append(grad)
                    continue
                state = self._state_of(grad_name, grad, *shape)
                matrix = grad.reshape(shape)
                if self.error_feedback:
                    matrix = matrix + state["error"]
                matrices.append(_Matrix(grad, state, matrix, matrix @ state["q"]))
        # with P matrices in the round everything is averaged (a sum is
        # scaled back in finish()); without, the op is used as it is
        first_op = Average if matrices or op == Average else Sum
        return _Round(matrices, plain, first_op, op)

    def second(self, round_: _Round, gathered: Any = None) -> list[torch.Tensor]:
        """After the first allreduce: orthonormalizes each ``P`` and returns
        the ``Q`` matrices for the caller to average in place (none when
        nothing was compressed), then :meth:`finish`."""
        with torch.no_grad():
            for m in round_.matrices:
                _orthonormalize(m.p)
                m.q = m.matrix.t() @ m.p
        return [m.q for m in round_.matrices]

    def finish(self, round_: _Round, ranks: int) -> None:
        """After the second allreduce: writes each gradient's ``P Q^T`` and
        keeps this rank's error and the new ``Q``; ``ranks`` is the number
        of ranks reducing (for ``op=Sum``)."""
        scale = float(ranks) if round_.op == Sum and round_.matrices else None
        with torch.no_grad():
            if scale is not None:
                for grad in round_.plain:  # averaged with the P matrices
                    grad.mul_(scale)
            # Q is averaged, the same on every rank, and so is what is
            # decided from it (one look at the values for the whole round)
            looks = torch.stack([torch.stack([torch.isfinite(m.q).all(),
                                              (m.q.abs().amax(dim=0) == 0).any()])
                                 for m in round_.matrices]).tolist() if round_.matrices else []
            for m, (finite, zero_column) in zip(round_.matrices, looks):
                approximation = m.p @ m.q.t()
                if finite:
                    if self.error_feedback:
                        torch.sub(m.matrix, approximation, out=m.state["error"])
                    if zero_column:
                        # a column no gradient fed would stay zero for good
                        zero = m.q.abs().amax(dim=0) == 0
                        fresh = _seeded(m.state["seed"] + self.iteration + 1, m.q.shape[0],
                                        m.q.shape[1], m.q)
                        m.q[:, zero] = fresh[:, zero]
                    m.state["q"] = m.q
                # else the step is to be skipped (an overflow): the result
                # stays non-finite, and Q and the error stay as they were
                if scale is not None:
                    approximation.mul_(scale)
                m.grad.copy_(approximation.view(m.grad.shape))
