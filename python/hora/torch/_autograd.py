"""autograd Functions of the differentiable collectives.

The backward passes are Horovod's, so that gradients match it exactly:

- allreduce: the same allreduce of the gradient, with the same op and
  scale factors;
- allgather: this rank's rows of the *average* over ranks of the gradient;
- broadcast: the average over ranks of the gradient on the root, zeros
  elsewhere;
- reducescatter: the allgather of the gradient times prescale * postscale,
  and also times size() for Sum;
- alltoall: the alltoall of the gradient back along the received splits.

With ``HORA_EXACT_REDUCE_GRADIENTS=1``, allreduce and reducescatter with
Min, Max and Product get instead the gradient of the sum over ranks of
every rank's loss (Horovod's repeat Min/Max/Product on the gradients, or
gather them, which is not the derivative). Each backward pass is itself a
collective, named after the forward collective when the user named it
(matched by call order otherwise).

A collective in a process set has its backward pass in the same set: "ranks"
above are then the set's ranks, ``size()`` the set's size and a rank's
slice its place in the set (Horovod's). Each Function takes the
:class:`hora.ProcessSet` last; the core's id of it travels in ``ctx``.
"""

import torch

from hora._loader import _C
from hora.common._adapter.naming import MemberNames
from hora.common.basics import ReduceOp, rank
from hora.torch._collectives import (
    Average, Handle, Max, Min, Sum, allgather_now, allreduce_handle, allreduce_now, grad_name,
    name_or_auto, process_set_id, reducescatter_now, set_rank, set_size, start_allgather,
    start_allreduce, start_alltoall, start_broadcast, start_reducescatter, sub_name, synchronize)

Product = ReduceOp.Product
# Ops whose gradient is the same allreduce of the incoming gradients.
_REPEATED = (Sum, Average, ReduceOp.Adasum)


def selection_op(op, prescale):
    # min(a * x) picks the largest x when a < 0
    if prescale >= 0:
        return op
    return Max if op == Min else Min


def product_of_others(x, name, ps, ident):
    """For each element, the product of the other ranks' values."""
    stacked = allgather_now(x.reshape((1,) + tuple(x.shape)), sub_name(name, "inputs"),
                            ident).clone()
    stacked[set_rank(ps)] = 1
    return stacked.prod(dim=0)


def allreduce_grad(grad, x, op, prescale, postscale, name, ps, ident):
    if op in _REPEATED or not _C.exact_reduce_gradients():
        return allreduce_now(grad, op, name, prescale, postscale, ident)
    total = allreduce_now(grad, Sum, sub_name(name, "sum"), process_set=ident)
    if op in (Min, Max):
        chosen = allreduce_now(x, selection_op(op, prescale), sub_name(name, "chosen"),
                               process_set=ident)
        mask = (x == chosen).to(grad.dtype)
        count = allreduce_now(mask, Sum, sub_name(name, "count"), process_set=ident)
        return total * mask / count * (prescale * postscale)
    if op == Product:
        others = product_of_others(x, name, ps, ident).to(grad.dtype)
        return total * others * (postscale * prescale ** set_size(ps))
    raise ValueError(f"allreduce: no gradient for op {op!r}")


class AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, named, op, prescale, postscale, ps):
        ident = process_set_id(ps)
        ctx.args = (name, named, op, prescale, postscale, ps, ident)
        if op not in _REPEATED:
            ctx.save_for_backward(tensor)
        works, outputs = start_allreduce([tensor], [name], op, prescale, postscale, False, ident)
        return synchronize(Handle(works, lambda ws: outputs[0]))

    @staticmethod
    def backward(ctx, grad):
        name, named, op, prescale, postscale, ps, ident = ctx.args
        x = ctx.saved_tensors[0] if ctx.saved_tensors else None
        result = allreduce_grad(grad, x, op, prescale, postscale,
                                grad_name(name, named, "grad"), ps, ident)
        return result, None, None, None, None, None, None


def grouped_allreduce_now(tensors, name, op, prescale, postscale, ident):
    """The grouped allreduce of checked ``tensors`` under the base ``name``,
    waited for: a list of new tensors."""
    return synchronize(allreduce_handle(tensors, MemberNames(name, len(tensors)), op, prescale,
                                        postscale, True, ident))


class GroupedAllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, named, op, prescale, postscale, ps, *tensors):
        ident = process_set_id(ps)
        ctx.args = (name, named, op, prescale, postscale, ps, ident)
        if op not in _REPEATED:
            ctx.save_for_backward(*tensors)
        return tuple(grouped_allreduce_now(tensors, name, op, prescale, postscale, ident))

    @staticmethod
    def backward(ctx, *grads):
        name, named, op, prescale, postscale, ps, ident = ctx.args
        base = name_or_auto(grad_name(name, named, "grad"), "grouped_allreduce", ident)
        if op in _REPEATED or not _C.exact_reduce_gradients():
            result = grouped_allreduce_now(list(grads), base, op, prescale, postscale, ident)
        else:
            result = [allreduce_grad(g, x, op, prescale, postscale, f"{base}.{i}", ps, ident)
                      for i, (g, x) in enumerate(zip(grads, ctx.saved_tensors))]
        return (None,) * 6 + tuple(result)


def allgather_grad(grads, rows, name, ps, ident):
    """This rank's slices of the averages of the gathered gradients."""
    base = name_or_auto(name, "grouped_allgather", ident)
    names = [f"{base}.{i}" for i in range(len(grads))]
    counts_works, counts_finish = start_allgather(
        [torch.tensor([rows], dtype=torch.int64)], [f"{base}.rows"], process_set=ident)
    handle = allreduce_handle(list(grads), names, Average, 1.0, 1.0, len(grads) > 1, ident)
    counts = synchronize(Handle(counts_works, lambda ws: counts_finish(ws)[0]))
    totals = synchronize(handle)
    offsets = counts[:set_rank(ps)].sum(dim=0)
    return [total.narrow(0, int(offsets[i]), rows[i]) for i, total in enumerate(totals)]


class AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, named, grouped, ps, *tensors):
        ident = process_set_id(ps)
        ctx.args = (name, named, [int(t.shape[0]) if t.dim() else 0 for t in tensors], ps, ident)
        names = [f"{name}.{i}" for i in range(len(tensors))] if grouped else [name]
        works, finish = start_allgather(tensors, names, grouped=grouped, process_set=ident)
        return tuple(synchronize(Handle(works, finish)))

    @staticmethod
    def backward(ctx, *grads):
        name, named, rows, ps, ident = ctx.args
        return (None,) * 4 + tuple(allgather_grad(grads, rows, grad_name(name, named, "grad"),
                                                  ps, ident))


class BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, named, ps):
        ident = process_set_id(ps)
        ctx.args = (root_rank, name, named, ident)
        return synchronize(Handle(*start_broadcast(tensor, root_rank, name, ident)))

    @staticmethod
    def backward(ctx, grad):
        root_rank, name, named, ident = ctx.args
        total = allreduce_now(grad, Average, grad_name(name, named, "grad"), process_set=ident)
        if rank() != root_rank:  # both global ranks
            total.zero_()
        return total, None, None, None, None


class AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, named, ps):
        ident = process_set_id(ps)
        works, finish = start_alltoall(tensor, splits, name, ident)
        output, received = synchronize(Handle(works, finish))
        ctx.args = (received.tolist(), name, named, ident)
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, _received_grad):
        received, name, named, ident = ctx.args
        works, finish = start_alltoall(
            grad, received, name_or_auto(grad_name(name, named, "grad"), "alltoall", ident), ident)
        return synchronize(Handle(works, finish))[0], None, None, None, None


def reducescatter_grad_scale(op, prescale, postscale, ps):
    # Horovod's: the set's size for Sum, nothing for Average, then both factors
    return prescale * postscale * (set_size(ps) if op == Sum else 1)


def reducescatter_grad(grad, x, op, prescale, postscale, name, ps, ident):
    if op in (Sum, Average) or not _C.exact_reduce_gradients():
        return (allgather_now(grad, name, ident)
                * reducescatter_grad_scale(op, prescale, postscale, ps))
    if op in (Min, Max):
        chosen_block = reducescatter_now(x, selection_op(op, prescale), sub_name(name, "chosen"),
                                         ident)
        chosen = allgather_now(chosen_block, sub_name(name, "chosen_all"), ident)
        mask = (x == chosen).to(grad.dtype)
        count = reducescatter_now(mask, Sum, sub_name(name, "count"), ident)
        share = allgather_now(grad / count, sub_name(name, "share"), ident)
        return share * mask * (prescale * postscale)
    if op == Product:
        others = product_of_others(x, name, ps, ident).to(grad.dtype)
        total = allgather_now(grad, sub_name(name, "grad"), ident)
        return total * others * (postscale * prescale ** set_size(ps))
    raise ValueError(f"reducescatter: no gradient for op {op!r}")


class ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, named, grouped, op, prescale, postscale, ps, *tensors):
        ident = process_set_id(ps)
        ctx.args = (name, named, op, prescale, postscale, ps, ident)
        if op not in (Sum, Average):
            ctx.save_for_backward(*tensors)
        names = [f"{name}.{i}" for i in range(len(tensors))] if grouped else [name]
        works, finish = start_reducescatter(tensors, names, op, prescale, postscale,
                                            grouped=grouped, process_set=ident)
        return tuple(synchronize(Handle(works, finish)))

    @staticmethod
    def backward(ctx, *grads):
        name, named, op, prescale, postscale, ps, ident = ctx.args
        base = name_or_auto(grad_name(name, named, "grad"), "reducescatter", ident)
        if op in (Sum, Average) and len(grads) > 1:
            scale = reducescatter_grad_scale(op, prescale, postscale, ps)
            names = [f"{base}.{i}" for i in range(len(grads))]
            works, finish = start_allgather(list(grads), names, grouped=True, process_set=ident)
            result = [g * scale for g in synchronize(Handle(works, finish))]
        else:
            saved = ctx.saved_tensors or (None,) * len(grads)
            result = [reducescatter_grad(g, x, op, prescale, postscale,
                                         base if len(grads) == 1 else f"{base}.{i}", ps, ident)
                      for i, (g, x) in enumerate(zip(grads, saved))]
        return (None,) * 7 + tuple(result)
