"""hora's collectives as PyTorch operators (``torch.ops.hora.*``), so that
``torch.compile`` (``fullgraph=True`` included), compiled autograd and
``torch.export`` trace them as graph nodes instead of breaking the graph.

Each operator runs the eager collective when the graph runs: the same
checks, names and Horovod exception classes. Its fake kernel gives the
result's shape (a data-dependent first dimension for allgather and
alltoall, whose sizes the other ranks decide), and its backward is another
operator whose kernel is the eager backward pass, so the gradients are
Horovod's exactly as in eager mode (see ``_autograd``).

The public functions in ``mpi_ops`` switch to these operators while
Dynamo traces them (``torch.compiler.is_compiling()``); eager calls keep
their direct path, which costs less per call. Names: a call named by the
user keeps its name; an unnamed one is named by call order when the graph
runs, as in eager mode, so every rank must run the same graphs.
"""

from __future__ import annotations

import torch
from torch import Tensor

if not hasattr(torch.library, "custom_op"):
    raise ImportError("hora's PyTorch operators need PyTorch 2.4 or later (torch.library."
                      "custom_op); with this PyTorch, compiled code breaks the graph at each "
                      "hora collective")

from hora.common._adapter.naming import MemberNames
from hora.common.basics import ReduceOp, rank
from hora.common.process_sets import ProcessSet, from_id
from hora.torch import _autograd
from hora.torch.compression import Compression
from hora.torch._collectives import (
    KIND_ALLREDUCE, KIND_BROADCAST, Average, Handle, Sum, allreduce_handle, check_op, check_root,
    check_tensor, check_tensors, grad_name, name_or_auto, resolve_op, set_rank, set_size,
    splits_list, start_allgather, start_allreduce, start_alltoall, start_broadcast,
    start_inplace_one, start_reducescatter, synchronize)

# ops whose backward is the same allreduce of the gradient (no saved input)
_SELF_GRADIENT = (int(Sum), int(Average), int(ReduceOp.Adasum))


def _set(ident: int, what: str) -> ProcessSet:
    """The registered set ``ident`` (-1: an unregistered one)."""
    return from_id(ident, what)


def _owned(result: Tensor, source: Tensor) -> Tensor:
    """An operator's output never aliases its input."""
    return result.clone() if result.data_ptr() == source.data_ptr() and result.numel() else result


# --- allreduce ---------------------------------------------------------------

@torch.library.custom_op("hora::allreduce", mutates_args=())
def allreduce_op(tensor: Tensor, name: str, op: int, prescale: float, postscale: float,
                 process_set: int) -> Tensor:
    _set(process_set, "allreduce")
    check_tensor(tensor, "allreduce")
    full = name_or_auto(name or None, "allreduce", process_set)
    works, outputs = start_allreduce([tensor], [full], ReduceOp(op), prescale, postscale, False,
                                     process_set)
    return _owned(synchronize(Handle(works, lambda ws: outputs[0])), tensor)


@allreduce_op.register_fake
def _(tensor, name, op, prescale, postscale, process_set):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


@torch.library.custom_op("hora::allreduce_backward", mutates_args=())
def allreduce_backward_op(grad: Tensor, saved: Tensor | None, name: str, op: int,
                          prescale: float, postscale: float, process_set: int) -> Tensor:
    ps = _set(process_set, "allreduce")
    result = _autograd.allreduce_grad(grad.contiguous(), saved, ReduceOp(op), prescale,
                                      postscale, grad_name(name, bool(name), "grad"), ps,
                                      process_set)
    return _owned(result, grad)


@allreduce_backward_op.register_fake
def _(grad, saved, name, op, prescale, postscale, process_set):
    return torch.empty_like(grad, memory_format=torch.contiguous_format)


def _allreduce_setup(ctx, inputs, output):
    tensor, name, op, prescale, postscale, process_set = inputs
    ctx.args = (name, op, prescale, postscale, process_set)
    ctx.save_for_backward(tensor if op not in _SELF_GRADIENT else None)


def _allreduce_backward(ctx, grad):
    name, op, prescale, postscale, process_set = ctx.args
    saved = ctx.saved_tensors[0]
    return (allreduce_backward_op(grad, saved, name, op, prescale, postscale, process_set),
            None, None, None, None, None)


allreduce_op.register_autograd(_allreduce_backward, setup_context=_allreduce_setup)


@torch.library.custom_op("hora::allreduce_", mutates_args=("tensor",))
def allreduce_inplace_op(tensor: Tensor, name: str, op: int, prescale: float, postscale: float,
                         process_set: int) -> None:
    _set(process_set, "allreduce_")
    check_tensor(tensor, "allreduce_")
    synchronize(start_inplace_one(KIND_ALLREDUCE, tensor,
                                  name_or_auto(name or None, "allreduce", process_set),
                                  ReduceOp(op), 0, prescale, postscale, process_set))


@allreduce_inplace_op.register_fake
def _(tensor, name, op, prescale, postscale, process_set):
    return None


# --- grouped allreduce ---------------------------------------------------------

@torch.library.custom_op("hora::grouped_allreduce", mutates_args=())
def grouped_allreduce_op(tensors: list[Tensor], name: str, op: int, prescale: float,
                         postscale: float, process_set: int) -> list[Tensor]:
    _set(process_set, "grouped_allreduce")
    tensors = check_tensors(tensors, "grouped_allreduce")
    base = name_or_auto(name or None, "grouped_allreduce", process_set)
    results = synchronize(allreduce_handle(tensors, MemberNames(base, len(tensors)),
                                           ReduceOp(op), prescale, postscale, True, process_set))
    return [_owned(r, t) for r, t in zip(results, tensors)]


@grouped_allreduce_op.register_fake
def _(tensors, name, op, prescale, postscale, process_set):
    return [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]


@torch.library.custom_op("hora::grouped_allreduce_backward", mutates_args=())
def grouped_allreduce_backward_op(grads: list[Tensor], saved: list[Tensor], name: str, op: int,
                                  prescale: float, postscale: float,
                                  process_set: int) -> list[Tensor]:
    ps = _set(process_set, "grouped_allreduce")
    grads = [g.contiguous() for g in grads]
    base = name_or_auto(grad_name(name, bool(name), "grad"), "grouped_allreduce", process_set)
    if op in _SELF_GRADIENT:
        results = synchronize(allreduce_handle(grads, MemberNames(base, len(grads)),
                                               ReduceOp(op), prescale, postscale, True,
                                               process_set))
    else:
        results = [_autograd.allreduce_grad(g, x, ReduceOp(op), prescale, postscale,
                                            f"{base}.{i}", ps, process_set)
                   for i, (g, x) in enumerate(zip(grads, saved))]
    return [_owned(r, g) for r, g in zip(results, grads)]


@grouped_allreduce_backward_op.register_fake
def _(grads, saved, name, op, prescale, postscale, process_set):
    return [torch.empty_like(g, memory_format=torch.contiguous_format) for g in grads]


def _grouped_setup(ctx, inputs, output):
    tensors, name, op, prescale, postscale, process_set = inputs
    ctx.args = (name, op, prescale, postscale, process_set)
    ctx.save_for_backward(*(tensors if op not in _SELF_GRADIENT else ()))


def _grouped_backward(ctx, grads):
    name, op, prescale, postscale, process_set = ctx.args
    return (grouped_allreduce_backward_op(list(grads), list(ctx.saved_tensors), name, op,
                                          prescale, postscale, process_set),
            None, None, None, None, None)


grouped_allreduce_op.register_autograd(_grouped_backward, setup_context=_grouped_setup)


# --- allgather -----------------------------------------------------------------

@torch.library.custom_op("hora::allgather", mutates_args=())
def allgather_op(tensor: Tensor, name: str, process_set: int) -> Tensor:
    _set(process_set, "allgather")
    check_tensor(tensor, "allgather")
    works, finish = start_allgather([tensor], [name_or_auto(name or None, "allgather",
                                                             process_set)],
                                    process_set=process_set)
    return _owned(synchronize(Handle(works, lambda ws: finish(ws)[0])), tensor)


@allgather_op.register_fake
def _(tensor, name, process_set):
    rows = torch.library.get_ctx().new_dynamic_size()  # the other ranks decide theirs
    return tensor.new_empty((rows, *tensor.shape[1:]))


@torch.library.custom_op("hora::allgather_backward", mutates_args=())
def allgather_backward_op(grad: Tensor, rows: int, name: str, process_set: int) -> Tensor:
    ps = _set(process_set, "allgather")
    return _autograd.allgather_grad([grad.contiguous()], [rows],
                                    grad_name(name, bool(name), "grad"), ps, process_set)[0].clone()


@allgather_backward_op.register_fake
def _(grad, rows, name, process_set):
    return grad.new_empty((rows, *grad.shape[1:]))


def _allgather_setup(ctx, inputs, output):
    tensor, name, process_set = inputs
    ctx.args = (tensor.shape[0] if tensor.dim() else 0, name, process_set)


def _allgather_backward(ctx, grad):
    rows, name, process_set = ctx.args
    return allgather_backward_op(grad, rows, name, process_set), None, None


allgather_op.register_autograd(_allgather_backward, setup_context=_allgather_setup)


# --- broadcast -----------------------------------------------------------------

@torch.library.custom_op("hora::broadcast", mutates_args=())
def broadcast_op(tensor: Tensor, root_rank: int, name: str, process_set: int) -> Tensor:
    _set(process_set, "broadcast")
    check_tensor(tensor, "broadcast")
    root_rank = check_root(root_rank, "broadcast")
    works, finish = start_broadcast(tensor, root_rank,
                                    name_or_auto(name or None, "broadcast", process_set),
                                    process_set)
    return _owned(synchronize(Handle(works, finish)), tensor)


@broadcast_op.register_fake
def _(tensor, root_rank, name, process_set):
    return torch.empty_like(tensor, memory_format=torch.contiguous_format)


@torch.library.custom_op("hora::broadcast_backward", mutates_args=())
def broadcast_backward_op(grad: Tensor, root_rank: int, name: str, process_set: int) -> Tensor:
    _set(process_set, "broadcast")
    works, outputs = start_allreduce([grad.contiguous()],
                                     [name_or_auto(grad_name(name, bool(name), "grad"),
                                                   "allreduce", process_set)],
                                     Average, 1.0, 1.0, False, process_set)
    total = synchronize(Handle(works, lambda ws: outputs[0]))
    if rank() != root_rank:  # both global ranks (Horovod's root_rank is global)
        total.zero_()
    return total


@broadcast_backward_op.register_fake
def _(grad, root_rank, name, process_set):
    return torch.empty_like(grad, memory_format=torch.contiguous_format)


def _broadcast_setup(ctx, inputs, output):
    _, root_rank, name, process_set = inputs
    ctx.args = (root_rank, name, process_set)


def _broadcast_backward(ctx, grad):
    root_rank, name, process_set = ctx.args
    return broadcast_backward_op(grad, root_rank, name, process_set), None, None, None


broadcast_op.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)


@torch.library.custom_op("hora::broadcast_", mutates_args=("tensor",))
def broadcast_inplace_op(tensor: Tensor, root_rank: int, name: str, process_set: int) -> None:
    _set(process_set, "broadcast_")
    check_tensor(tensor, "broadcast_")
    root_rank = check_root(root_rank, "broadcast_")
    synchronize(start_inplace_one(KIND_BROADCAST, tensor,
                                  name_or_auto(name or None, "broadcast", process_set),
                                  root=root_rank, process_set=process_set))


@broadcast_inplace_op.register_fake
def _(tensor, root_rank, name, process_set):
    return None


# --- alltoall ------------------------------------------------------------------

@torch.library.custom_op("hora::alltoall", mutates_args=())
def alltoall_op(tensor: Tensor, splits: list[int] | None, name: str,
                process_set: int) -> tuple[Tensor, Tensor]:
    _set(process_set, "alltoall")
    check_tensor(tensor, "alltoall")
    splits = splits_list(splits, "alltoall")
    works, finish = start_alltoall(tensor, splits, name_or_auto(name or None, "alltoall",
                                                                process_set), process_set)
    output, received = synchronize(Handle(works, finish))
    return _owned(output, tensor), received


@alltoall_op.register_fake
def _(tensor, splits, name, process_set):
    rows = torch.library.get_ctx().new_dynamic_size()  # what the other ranks send
    received = torch.empty((set_size(_set(process_set, "alltoall")),), dtype=torch.int32)
    return tensor.new_empty((rows, *tensor.shape[1:])), received


@torch.library.custom_op("hora::alltoall_backward", mutates_args=())
def alltoall_backward_op(grad: Tensor, received: Tensor, name: str, process_set: int) -> Tensor:
    _set(process_set, "alltoall")
    works, finish = start_alltoall(grad.contiguous(), received.tolist(),
                                   name_or_auto(grad_name(name, bool(name), "grad"), "alltoall",
                                                process_set), process_set)
    return synchronize(Handle(works, finish))[0].clone()


@alltoall_backward_op.register_fake
def _(grad, received, name, process_set):
    rows = torch.library.get_ctx().new_dynamic_size()  # what this rank sent
    return grad.new_empty((rows, *grad.shape[1:]))


def _alltoall_setup(ctx, inputs, output):
    _, _, name, process_set = inputs
    ctx.args = (name, process_set)
    ctx.save_for_backward(output[1])
    ctx.mark_non_differentiable(output[1])


def _alltoall_backward(ctx, grad, _received_grad):
    name, process_set = ctx.args
    return alltoall_backward_op(grad, ctx.saved_tensors[0], name, process_set), None, None, None


alltoall_op.register_autograd(_alltoall_backward, setup_context=_alltoall_setup)


# --- reducescatter -------------------------------------------------------------

@torch.library.custom_op("hora::reducescatter", mutates_args=())
def reducescatter_op(tensor: Tensor, name: str, op: int, prescale: float, postscale: float,
                     process_set: int) -> Tensor:
    _set(process_set, "reducescatter")
    check_tensor(tensor, "reducescatter")
    op = check_op(ReduceOp(op))
    works, finish = start_reducescatter([tensor], [name_or_auto(name or None, "reducescatter",
                                                                 process_set)],
                                        op, prescale, postscale, process_set=process_set)
    return _owned(synchronize(Handle(works, lambda ws: finish(ws)[0])), tensor)


def _block_rows(rows, ps: ProcessSet):
    """This rank's block of ``rows``: the first ``rows % size`` ranks get one
    more (Horovod's)."""
    size, rank = set_size(ps), set_rank(ps)
    # rows // size, plus one when rank < rows % size, without a comparison
    # (rows may be a symbol only known when the graph runs)
    return (rows + size - 1 - rank) // size


@reducescatter_op.register_fake
def _(tensor, name, op, prescale, postscale, process_set):
    rows = _block_rows(tensor.shape[0], _set(process_set, "reducescatter")) if tensor.dim() else 0
    return tensor.new_empty((rows, *tensor.shape[1:]))


@torch.library.custom_op("hora::reducescatter_backward", mutates_args=())
def reducescatter_backward_op(grad: Tensor, saved: Tensor | None, rows: int, name: str, op: int,
                              prescale: float, postscale: float, process_set: int) -> Tensor:
    ps = _set(process_set, "reducescatter")
    base = name_or_auto(grad_name(name, bool(name), "grad"), "reducescatter", process_set)
    return _owned(_autograd.reducescatter_grad(grad.contiguous(), saved, ReduceOp(op), prescale,
                                               postscale, base, ps, process_set), grad)


@reducescatter_backward_op.register_fake
def _(grad, saved, rows, name, op, prescale, postscale, process_set):
    return grad.new_empty((rows, *grad.shape[1:]))  # the forward's input


def _reducescatter_setup(ctx, inputs, output):
    tensor, name, op, prescale, postscale, process_set = inputs
    ctx.args = (tensor.shape[0], name, op, prescale, postscale, process_set)
    ctx.save_for_backward(tensor if op not in _SELF_GRADIENT else None)


def _reducescatter_backward(ctx, grad):
    rows, name, op, prescale, postscale, process_set = ctx.args
    return (reducescatter_backward_op(grad, ctx.saved_tensors[0], rows, name, op, prescale,
                                      postscale, process_set), None, None, None, None, None)


reducescatter_op.register_autograd(_reducescatter_backward, setup_context=_reducescatter_setup)


# --- what the public functions run while Dynamo traces them ----------------------
#
# Plain Python that Dynamo inlines: the arguments become the operators'
# constants (a process set by its id; checks that need the tensors run in
# the operators).

def _ident(process_set: ProcessSet | None) -> int:
    if process_set is None:
        return 0
    ident = process_set.process_set_id
    return -1 if ident is None else ident


def traced_allreduce(tensor, average, name, compression, op, prescale, postscale, process_set):
    code = int(resolve_op(average, op, "allreduce"))
    compressed, ctx = compression.compress(tensor)
    reduced = allreduce_op(compressed, name or "", code, float(prescale), float(postscale),
                           _ident(process_set))
    return compression.decompress(reduced, ctx)


def traced_allreduce_(tensor, average, name, op, prescale, postscale, process_set):
    code = int(resolve_op(average, op, "allreduce_"))
    allreduce_inplace_op(tensor, name or "", code, float(prescale), float(postscale),
                         _ident(process_set))
    return tensor


def traced_grouped_allreduce(tensors, average, name, compression, op, prescale, postscale,
                             process_set):
    code = int(resolve_op(average, op, "grouped_allreduce"))
    tensors = list(tensors)
    if not tensors:
        return []
    compressed = [compression.compress(t) for t in tensors]
    outputs = grouped_allreduce_op([c for c, _ in compressed], name or "", code, float(prescale),
                                   float(postscale), _ident(process_set))
    return [compression.decompress(out, ctx) for out, (_, ctx) in zip(outputs, compressed)]


def traced_grouped_allreduce_(tensors, average, name, op, prescale, postscale, process_set):
    tensors = list(tensors)
    outputs = traced_grouped_allreduce(tensors, average, name, Compression.none, op, prescale,
                                       postscale, process_set)
    for tensor, output in zip(tensors, outputs):
        tensor.copy_(output)
    return tensors


def traced_allgather(tensor, name, process_set):
    return allgather_op(tensor, name or "", _ident(process_set))


def traced_broadcast(tensor, root_rank, name, process_set):
    return broadcast_op(tensor, check_root(root_rank, "broadcast"), name or "",
                        _ident(process_set))


def traced_broadcast_(tensor, root_rank, name, process_set):
    broadcast_inplace_op(tensor, check_root(root_rank, "broadcast_"), name or "",
                         _ident(process_set))
    return tensor


def traced_alltoall(tensor, splits, name, process_set, always_received=False):
    given = splits is not None or always_received
    if isinstance(splits, torch.Tensor):
        splits = splits.tolist()  # a graph break: pass a list of ints to stay in the graph
    output, received = alltoall_op(tensor, None if splits is None else [int(s) for s in splits],
                                   name or "", _ident(process_set))
    return (output, received) if given else output


def traced_reducescatter(tensor, name, compression, op, process_set, prescale, postscale):
    compressed, ctx = compression.compress(tensor)
    out = reducescatter_op(compressed, name or "", int(op), float(prescale), float(postscale),
                           _ident(process_set))
    return compression.decompress(out, ctx)
