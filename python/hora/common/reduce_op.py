"""Reduction operations: a leaf module, so that every part of hora.common
can name them without importing the runtime."""

from __future__ import annotations

import enum

from hora._loader import _C


class ReduceOp(enum.IntEnum):
    """Reduction operations. The values match Horovod's (the core defines
    them; ``_C.REDUCE_OPS``). ``Min`` and ``Max`` keep a NaN from any rank,
    as NumPy's ``minimum`` and ``maximum`` do, on host memory (GPU tensors
    reduced by NCCL follow NCCL's own rule)."""

    Average = _C.REDUCE_OPS["Average"]
    Sum = _C.REDUCE_OPS["Sum"]
    Adasum = _C.REDUCE_OPS["Adasum"]
    Min = _C.REDUCE_OPS["Min"]
    Max = _C.REDUCE_OPS["Max"]
    Product = _C.REDUCE_OPS["Product"]


Average = ReduceOp.Average
Sum = ReduceOp.Sum
Adasum = ReduceOp.Adasum
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product
