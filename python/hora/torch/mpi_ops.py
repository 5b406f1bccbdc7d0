"""Collectives on ``torch.Tensor`` with Horovod's names and semantics.

Every function here is collective: all ranks must call it, with matching
names (unnamed calls are matched by call order). Tensors live on the CPU
or on a CUDA GPU (through NCCL in a CUDA build, ordered against torch's
current stream; copied through host memory otherwise); non-contiguous
tensors are copied (the in-place variants copy the result back). Argument
errors raise ``ValueError``/``TypeError`` at once; ranks that disagree
about a collective (shape, dtype, op, ...) get
:class:`hora.HoraMismatchError` on every rank.

The synchronous ``allreduce``, ``grouped_allreduce``, ``allgather``,
``grouped_allgather``, ``broadcast``, ``alltoall``, ``reducescatter`` and
``grouped_reducescatter`` are differentiable, with Horovod's gradients: an
allreduce's is the same allreduce of the incoming gradients, an allgather's
this rank's slice of their average over ranks, a broadcast's their average
on the root (zero elsewhere), a reducescatter's their allgather (times
``size()`` for Sum). Their backward passes are collectives too, so every
rank must run backward through them.

Every collective takes ``process_set`` (default ``global_process_set``, all
ranks), as in Horovod: a :class:`hora.ProcessSet` made by
``hvd.add_process_set`` or ``hvd.init(process_sets=...)`` runs it among that
set's ranks only, and only they call it. "All ranks" then means the set's
ranks: Average divides by the set's size, results come in the set's rank
order, alltoall splits have one entry per member, ``root_rank`` stays a
global rank (one of the set's), and the backward passes run in the same set.
Unnamed calls are matched by call order within each set. A rank outside the
set, or a set that is not registered, gets ``ValueError``.

Inside ``torch.compile`` (``fullgraph=True`` included), compiled autograd
and ``torch.export``, the synchronous collectives and ``allreduce_`` /
``broadcast_`` trace as PyTorch operators (``torch.ops.hora.allreduce``,
``grouped_allreduce``, ``allgather``, ``broadcast``, ``alltoall``,
``reducescatter``), with the same results, gradients and errors as in
eager mode. Unnamed calls are then named by call order when the graph runs,
so every rank must run the same graphs. Pass alltoall's ``splits`` as a
list there: a tensor of splits breaks the graph. The ``*_async`` forms run
the same operators there and return a handle that is already complete:
the graph orders the collective, so nothing overlaps it in Python.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from hora.common import ops as _numpy_ops
from hora.common._adapter.handles import (  # noqa: F401 (re-exported)
    CallableHandle, DoneHandle, Handle, poll, synchronize)
from hora.common._adapter.naming import group_names, member_names
# Horovod's torch.mpi_ops has the reduce ops too
from hora.common.basics import (  # noqa: F401
    Adasum, Average, Max, Min, Product, ReduceOp, Sum, size)
from hora.common.compression import Compressor
from hora.common.process_sets import (  # noqa: F401 (Horovod's torch.mpi_ops has them)
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from hora.torch._autograd import (
    AllgatherFunction, AllreduceFunction, AlltoallFunction, BroadcastFunction,
    GroupedAllreduceFunction, ReducescatterFunction, grouped_allreduce_now)
from hora.torch._collectives import (
    KIND_ALLREDUCE, KIND_BROADCAST, allreduce_handle, allreduce_now, check_op, check_root,
    check_tensor, check_tensors, name_or_auto, resolve_op, set_id, set_object, set_size,
    splits_list, start_allgather, start_allreduce, start_alltoall, start_broadcast,
    start_inplace, start_inplace_one, start_reducescatter)
from hora.torch.compression import Compression

try:
    from hora.torch import _library
except ImportError:  # PyTorch before 2.4: no torch.library.custom_op
    _library = None  # type: ignore[assignment]
# While Dynamo traces, the collectives hand over to their operators.
_compiling = torch.compiler.is_compiling if _library is not None else (lambda: False)


# --- allreduce ---------------------------------------------------------------

def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
                    postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts an allreduce of ``tensor`` and returns a handle for :func:`poll`
    / :func:`synchronize`; ``synchronize`` returns a new tensor with the
    reduction. ``op`` defaults to Average (``average`` is the deprecated
    spelling: True means Average, False Sum). Raises ``ValueError`` for a
    tensor on a device other than CPU or CUDA, an unknown op, a process set
    this rank is not in, ``TypeError`` for an
    unsupported dtype. Not differentiable."""
    if _compiling():
        return DoneHandle(_library.traced_allreduce(
            tensor.detach(), average, name, Compression.none, op, prescale_factor,
            postscale_factor, process_set))
    ident = set_id(process_set, "allreduce_async")
    op = resolve_op(average, op, "allreduce_async")
    check_tensor(tensor, "allreduce_async")
    works, outputs = start_allreduce([tensor], [name_or_auto(name, "allreduce", ident)], op,
                                     prescale_factor, postscale_factor, False, ident)
    return Handle(works, lambda ws: outputs[0])


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: type[Compressor] = Compression.none,
              op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Returns a new tensor holding the reduction of ``tensor`` over all ranks.

    ``op`` is one of Sum, Average (the default), Min, Max, Product;
    ``prescale_factor`` multiplies the input and ``postscale_factor`` the
    result (integers are scaled in float64 and truncated toward zero, as
    Horovod does). ``compression`` (default
    ``Compression.none``) casts the tensor for the wire and back.
    float16/bfloat16 accumulate in float32 (on the ring between hosts they
    travel as halves, rounded once per hop). Differentiable: the gradient is
    the same allreduce of the incoming gradients (for Min/Max it flows to
    the ranks holding the extreme, shared equally on ties; for Product to
    every rank as the product of the others). ``process_set`` limits it to
    that set's ranks (see the module docstring). Raises ``ValueError`` for a
    tensor on a device other than CPU or CUDA, a bad op or a process set this
    rank is not in, ``TypeError`` for an unsupported dtype,
    :class:`hora.HoraMismatchError` when ranks disagree."""
    if _compiling():
        return _library.traced_allreduce(tensor, average, name, compression, op, prescale_factor,
                                         postscale_factor, process_set)
    ident = set_id(process_set, "allreduce")
    op = resolve_op(average, op, "allreduce")
    check_tensor(tensor, "allreduce")
    named = name is not None
    name = name_or_auto(name, "allreduce", ident)
    if compression is Compression.none and not (torch.is_grad_enabled() and tensor.requires_grad):
        # nothing to differentiate: the same collective without autograd's
        # bookkeeping
        return allreduce_now(tensor, op, name, float(prescale_factor), float(postscale_factor),
                             ident)
    compressed, ctx = compression.compress(tensor)
    reduced = AllreduceFunction.apply(compressed, name, named, op, float(prescale_factor),
                                      float(postscale_factor), set_object(process_set))
    return compression.decompress(reduced, ctx)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
                     postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """In-place :func:`allreduce_async`: the result overwrites ``tensor``;
    ``synchronize`` returns ``tensor``. Same defaults and errors."""
    if _compiling():
        return DoneHandle(_library.traced_allreduce_(
            tensor, average, name, op, prescale_factor, postscale_factor, process_set))
    ident = set_id(process_set, "allreduce_async_")
    op = resolve_op(average, op, "allreduce_async_")
    check_tensor(tensor, "allreduce_async_")
    return start_inplace_one(KIND_ALLREDUCE, tensor, name_or_auto(name, "allreduce", ident), op,
                             0, prescale_factor, postscale_factor, ident)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
               postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place :func:`allreduce` (not differentiable); returns ``tensor``."""
    if _compiling():
        return _library.traced_allreduce_(tensor, average, name, op, prescale_factor,
                                          postscale_factor, process_set)
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


# --- grouped allreduce ---------------------------------------------------------

def grouped_allreduce_async(tensors: Iterable[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: ReduceOp | int | None = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Starts an allreduce of a list of tensors negotiated and fused as one
    unit; ``synchronize`` returns a list of new tensors. Defaults and errors
    as :func:`allreduce_async`; not differentiable."""
    if _compiling():
        return DoneHandle(_library.traced_grouped_allreduce(
            [t.detach() for t in tensors], average, name, Compression.none, op, prescale_factor,
            postscale_factor, process_set))
    ident = set_id(process_set, "grouped_allreduce_async")
    op = resolve_op(average, op, "grouped_allreduce_async")
    listed = check_tensors(tensors, "grouped_allreduce_async")
    names = member_names(name, len(listed), "grouped_allreduce", ident)
    return allreduce_handle(listed, names, op, prescale_factor, postscale_factor, True, ident)


def grouped_allreduce(tensors: Iterable[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: type[Compressor] = Compression.none,
                      op: ReduceOp | int | None = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce of a list of tensors as one fused unit; returns a list of new
    tensors. Defaults, errors and gradients as :func:`allreduce`."""
    if _compiling():
        return _library.traced_grouped_allreduce(tensors, average, name, compression, op,
                                                 prescale_factor, postscale_factor,
                                                 process_set)
    ident = set_id(process_set, "grouped_allreduce")
    op = resolve_op(average, op, "grouped_allreduce")
    tensors = check_tensors(tensors, "grouped_allreduce")
    if not tensors:
        return []
    named = name is not None
    name = name_or_auto(name, "grouped_allreduce", ident)
    if compression is Compression.none and not (
            torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        # nothing to differentiate: the same collective without autograd's
        # bookkeeping on every tensor
        return grouped_allreduce_now(tensors, name, op, float(prescale_factor),
                                     float(postscale_factor), ident)
    compressed = [compression.compress(t) for t in tensors]
    outputs = GroupedAllreduceFunction.apply(name, named, op, float(prescale_factor),
                                             float(postscale_factor), set_object(process_set),
                                             *[c for c, _ in compressed])
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(outputs, compressed)]


def grouped_allreduce_async_(tensors: Iterable[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: ReduceOp | int | None = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> Handle:
    """In-place :func:`grouped_allreduce_async`; ``synchronize`` returns the
    list of input tensors, now holding the results."""
    if _compiling():
        return DoneHandle(_library.traced_grouped_allreduce_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set))
    ident = set_id(process_set, "grouped_allreduce_async_")
    op = resolve_op(average, op, "grouped_allreduce_async_")
    listed = check_tensors(tensors, "grouped_allreduce_async_")
    names = member_names(name, len(listed), "grouped_allreduce", ident)
    works, finish = start_inplace(KIND_ALLREDUCE, listed, names, op, 0, prescale_factor,
                                  postscale_factor, grouped=True, process_set=ident)
    return Handle(works, lambda ws: (finish(), listed)[1])


def grouped_allreduce_(tensors: Iterable[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: ReduceOp | int | None = None,
                       prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """In-place :func:`grouped_allreduce` (not differentiable); returns the
    list of tensors."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def sparse_allreduce_async(tensor: torch.Tensor, name: str | None = None,
                           op: ReduceOp | int = Average,
                           process_set: ProcessSet = global_process_set) -> Handle:
    """Starts a reduction of a sparse COO ``tensor`` by gathering every rank's
    indices and values. The handle is called for the result (``handle()``,
    as in Horovod) or passed to ``synchronize``: a coalesced sparse tensor.
    ``op`` must be Average (default) or Sum, else ``ValueError``; Average
    divides by the size of ``process_set``. All ranks must pass sparse
    tensors of the same size."""
    ident = set_id(process_set, "sparse_allreduce_async")
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.sparse_coo:
        raise TypeError("sparse_allreduce_async: expected a sparse COO torch.Tensor")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"sparse_allreduce_async: the tensor is on device '{tensor.device}'; "
                         f"hora.torch handles CPU and CUDA tensors")
    op = check_op(op)
    if op not in (Average, Sum):
        raise ValueError(f"sparse_allreduce_async: op must be Average or Sum, got {op.name}")
    t = tensor.detach().coalesce()
    base = name_or_auto(name, "sparse_allreduce", ident)
    indices, values = t.indices().t(), t.values()
    check_tensor(values, "sparse_allreduce_async (values)")
    works, gather = start_allgather([indices, values], [f"{base}.indices", f"{base}.values"],
                                    process_set=ident)
    shape = t.shape
    members = set_size(process_set)

    def finish(ws):
        all_indices, all_values = gather(ws)
        if op == Average:
            all_values = all_values / members
        return torch.sparse_coo_tensor(all_indices.t(), all_values, shape,
                                       check_invariants=False).coalesce()
    return CallableHandle(works, finish)


# --- allgather -----------------------------------------------------------------

def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts an allgather; ``synchronize`` returns the concatenation of every
    rank's ``tensor`` along the first dimension. Not differentiable."""
    if _compiling():
        return DoneHandle(_library.traced_allgather(tensor.detach(), name, process_set))
    ident = set_id(process_set, "allgather_async")
    check_tensor(tensor, "allgather_async")
    works, finish = start_allgather([tensor], [name_or_auto(name, "allgather", ident)],
                                    process_set=ident)
    return Handle(works, lambda ws: finish(ws)[0])


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Returns every rank's ``tensor`` concatenated along the first dimension,
    in rank order. The first dimension may differ between ranks; the others
    and the dtype must match (else :class:`hora.HoraMismatchError`). A 0-d
    tensor raises ``ValueError``. Differentiable: the gradient is this rank's
    slice of the average over ranks of the incoming gradients (Horovod's)."""
    if _compiling():
        return _library.traced_allgather(tensor, name, process_set)
    ident = set_id(process_set, "allgather")
    check_tensor(tensor, "allgather")
    named = name is not None
    return AllgatherFunction.apply(name_or_auto(name, "allgather", ident), named, False,
                                   set_object(process_set), tensor)[0]


def grouped_allgather_async(tensors: Iterable[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> Handle:
    """Starts an allgather of a list of tensors as one unit; ``synchronize``
    returns a list of gathered tensors. Not differentiable."""
    ident = set_id(process_set, "grouped_allgather_async")
    listed = check_tensors(tensors, "grouped_allgather_async")
    names = group_names(name, len(listed), "grouped_allgather", ident)
    works, finish = start_allgather(listed, names, grouped=True, process_set=ident)
    return Handle(works, finish)


def grouped_allgather(tensors: Iterable[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """:func:`allgather` of each tensor in a list, negotiated as one unit;
    returns a list. Differentiable like :func:`allgather`."""
    ident = set_id(process_set, "grouped_allgather")
    tensors = check_tensors(tensors, "grouped_allgather")
    if not tensors:
        return []
    named = name is not None
    name = name_or_auto(name, "grouped_allgather", ident)
    return list(AllgatherFunction.apply(name, named, True, set_object(process_set), *tensors))


# --- broadcast -----------------------------------------------------------------

def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> Handle:
    """Starts a broadcast of ``root_rank``'s ``tensor``; ``synchronize``
    returns a new tensor with the root's values. Raises ``ValueError`` for a
    root out of range; not differentiable."""
    if _compiling():
        return DoneHandle(_library.traced_broadcast(tensor.detach(), root_rank, name,
                                                         process_set))
    ident = set_id(process_set, "broadcast_async")
    check_tensor(tensor, "broadcast_async")
    root_rank = check_root(root_rank, "broadcast_async")
    return Handle(*start_broadcast(tensor, root_rank, name_or_auto(name, "broadcast", ident),
                                   ident))


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Returns a new tensor holding ``root_rank``'s ``tensor`` on every rank
    (shapes and dtypes must match across ranks). Differentiable: the root's
    gradient is the average of every rank's incoming gradient, the other
    ranks' is zero (Horovod's). Raises ``ValueError`` for a root out of range."""
    if _compiling():
        return _library.traced_broadcast(tensor, root_rank, name, process_set)
    ident = set_id(process_set, "broadcast")
    check_tensor(tensor, "broadcast")
    root_rank = check_root(root_rank, "broadcast")
    named = name is not None
    name = name_or_auto(name, "broadcast", ident)
    return BroadcastFunction.apply(tensor, root_rank, name, named, set_object(process_set))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Handle:
    """In-place :func:`broadcast_async`; ``synchronize`` returns ``tensor``,
    overwritten with the root's values."""
    if _compiling():
        return DoneHandle(_library.traced_broadcast_(tensor, root_rank, name, process_set))
    ident = set_id(process_set, "broadcast_async_")
    check_tensor(tensor, "broadcast_async_")
    root_rank = check_root(root_rank, "broadcast_async_")
    return start_inplace_one(KIND_BROADCAST, tensor, name_or_auto(name, "broadcast", ident),
                             root=root_rank, process_set=ident)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrites ``tensor`` with ``root_rank``'s values and returns it (not
    differentiable)."""
    if _compiling():
        return _library.traced_broadcast_(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# --- alltoall ------------------------------------------------------------------

def alltoall_async(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
                   name: str | None = None, process_set: ProcessSet = global_process_set) -> Handle:
    """Starts an alltoall; ``synchronize`` returns ``(output,
    received_splits)`` (see :func:`alltoall`). Not differentiable."""
    if _compiling():
        return DoneHandle(_library.traced_alltoall(tensor.detach(), splits, name, process_set,
                                                        always_received=True))
    ident = set_id(process_set, "alltoall_async")
    check_tensor(tensor, "alltoall_async")
    splits = splits_list(splits, "alltoall_async")
    works, finish = start_alltoall(tensor, splits, name_or_auto(name, "alltoall", ident), ident)
    return Handle(works, finish)


def alltoall(tensor: torch.Tensor, splits: torch.Tensor | Sequence[int] | None = None,
             name: str | None = None, process_set: ProcessSet = global_process_set
             ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Sends ``splits[r]`` consecutive rows of ``tensor`` to rank ``r``; the
    output is the rows received from every rank, concatenated in rank order.
    Without ``splits`` the first dimension is divided evenly (``ValueError``
    if it does not divide) and only the output is returned; with ``splits``
    (a list or integer tensor of ``size()`` entries summing to the first
    dimension, else ``ValueError``) returns ``(output, received_splits)``,
    the latter an int32 tensor. Differentiable with respect to ``tensor``:
    gradients travel back by the reverse alltoall."""
    if _compiling():
        return _library.traced_alltoall(tensor, splits, name, process_set)
    ident = set_id(process_set, "alltoall")
    check_tensor(tensor, "alltoall")
    given = splits is not None
    splits = splits_list(splits, "alltoall")
    named = name is not None
    name = name_or_auto(name, "alltoall", ident)
    output, received = AlltoallFunction.apply(tensor, splits, name, named,
                                              set_object(process_set))
    return (output, received) if given else output


# --- reducescatter -------------------------------------------------------------

def reducescatter_async(tensor: torch.Tensor, name: str | None = None,
                        op: ReduceOp | int = Average, process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> Handle:
    """Starts a reducescatter; ``synchronize`` returns this rank's block of
    the reduction (see :func:`reducescatter`). Not differentiable."""
    if _compiling():
        return DoneHandle(_library.traced_reducescatter(
            tensor.detach(), name, Compression.none, op, process_set, prescale_factor,
            postscale_factor))
    ident = set_id(process_set, "reducescatter_async")
    check_tensor(tensor, "reducescatter_async")
    op = check_op(op)
    works, finish = start_reducescatter([tensor], [name_or_auto(name, "reducescatter", ident)],
                                        op, prescale_factor, postscale_factor,
                                        process_set=ident)
    return Handle(works, lambda ws: finish(ws)[0])


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: type[Compressor] = Compression.none,
                  op: ReduceOp | int = Average, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduces ``tensor`` over all ranks with ``op`` (Average by default) and
    returns this rank's block of rows; when the first dimension does not
    divide by ``size()`` the first ``rows % size()`` ranks get one extra row.
    A 0-d tensor raises ``ValueError``. Differentiable: the gradient is the
    allgather of the incoming gradients times the scale factors, and times
    ``size()`` for Sum (Horovod's)."""
    if _compiling():
        return _library.traced_reducescatter(tensor, name, compression, op, process_set,
                                             prescale_factor, postscale_factor)
    ident = set_id(process_set, "reducescatter")
    check_tensor(tensor, "reducescatter")
    op = check_op(op)
    compressed, ctx = compression.compress(tensor)
    named = name is not None
    out = ReducescatterFunction.apply(name_or_auto(name, "reducescatter", ident), named, False,
                                      op, float(prescale_factor), float(postscale_factor),
                                      set_object(process_set), compressed)[0]
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors: Iterable[torch.Tensor], name: str | None = None,
                                op: ReduceOp | int = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> Handle:
    """Starts a reducescatter of a list of tensors as one unit; ``synchronize``
    returns a list of blocks. Not differentiable."""
    ident = set_id(process_set, "grouped_reducescatter_async")
    listed = check_tensors(tensors, "grouped_reducescatter_async")
    op = check_op(op)
    names = group_names(name, len(listed), "grouped_reducescatter", ident)
    works, finish = start_reducescatter(listed, names, op, prescale_factor, postscale_factor,
                                        grouped=True, process_set=ident)
    return Handle(works, finish)


def grouped_reducescatter(tensors: Iterable[torch.Tensor], name: str | None = None,
                          compression: type[Compressor] = Compression.none,
                          op: ReduceOp | int = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """:func:`reducescatter` of each tensor in a list, negotiated as one unit;
    returns a list. Defaults, errors and gradients as :func:`reducescatter`."""
    ident = set_id(process_set, "grouped_reducescatter")
    tensors = check_tensors(tensors, "grouped_reducescatter")
    op = check_op(op)
    if not tensors:
        return []
    compressed = [compression.compress(t) for t in tensors]
    named = name is not None
    outputs = ReducescatterFunction.apply(name_or_auto(name, "grouped_reducescatter", ident),
                                          named, True, op, float(prescale_factor),
                                          float(postscale_factor), set_object(process_set),
                                          *[c for c, _ in compressed])
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(outputs, compressed)]


# --- synchronization -------------------------------------------------------------

def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Returns once every rank (of ``process_set``) has called ``barrier``."""
    set_id(process_set, "barrier")
    _numpy_ops.barrier(process_set=set_object(process_set))


def join(device: int = -1) -> int:
    """Marks this rank as out of data and returns the rank that joined last,
    once every rank has joined. Meanwhile this rank takes part in the other
    ranks' allreduces with zeros (an Average still divides by ``size()``, as
    in Horovod, unless ``HORA_JOIN_AVERAGE=contributors``). ``device`` is
    accepted for Horovod compatibility: a joined rank's GPU zeros go to the
    GPU this process already uses for hora (else the one matching its local
    rank). Raises ``ValueError`` for
    a negative device other than -1."""
    if device is not None and int(device) < -1:
        raise ValueError(f"join(device={device}): device must be -1 (CPU) or a GPU index")
    return _numpy_ops.join()
