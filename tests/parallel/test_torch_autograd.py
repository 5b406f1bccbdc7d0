"""Gradients of the differentiable hora.torch collectives.

The objective is the sum over ranks of each rank's loss ``(out * w_r).sum()``.
Every rank checks its input's gradient two ways: against torch autograd on a
single-process reference of the collective over all ranks' inputs, and
against central finite differences of the objective (each rank perturbing
its input in turn while the others keep theirs). Where Horovod's backward
pass differs from that gradient by a constant (allgather and broadcast
average the gradient, reducescatter multiplies it by the world size), hora
matches Horovod: ``horovod_factor`` says by how much. For Min, Max and
Product Horovod's backward is not that gradient at all (it repeats the op
on the gradients, or gathers them): ``horovod_gradient`` computes it, and
with ``HORA_EXACT_REDUCE_GRADIENTS=1`` (tests/test_parallel_suite.py runs
this file so too) hora gives the exact gradient instead.
"""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from hora._loader import _C  # noqa: E402
from torch_helpers import float_input  # noqa: E402

# the cases whose gradient Horovod defines otherwise: (kind, op, prescale,
# postscale); see horovod_gradient
HOROVOD_OWN = {
    "allreduce_min": ("allreduce", hvd.Min, 1.0, 1.0),
    "allreduce_max_negative_prescale": ("allreduce", hvd.Max, -2.0, 1.0),
    "allreduce_product": ("allreduce", hvd.Product, 1.5, 1.0),
    "grouped_allreduce_max": ("grouped_max", hvd.Max, 1.0, 1.0),
    "reducescatter_min": ("reducescatter", hvd.Min, 1.0, 1.0),
    "reducescatter_product": ("reducescatter", hvd.Product, 1.0, 2.0),
}


def exact():
    return _C.exact_reduce_gradients()


def horovod_gradient(case, weights, rank, size):
    """Horovod's backward pass of the cases in HOROVOD_OWN, given every
    rank's incoming gradient (its weights)."""
    kind, op, pre, post = HOROVOD_OWN[case]
    if kind == "allreduce":  # the same allreduce of the gradients
        return post * reduce_stack(op, pre * torch.stack(weights))
    if kind == "reducescatter":  # the gathered gradient, times the factors
        return torch.cat(weights) * (pre * post)
    # flat([max(x), max(x[1:] * 3)]): each part's gradient allreduced with Max
    first = reduce_stack(op, torch.stack([w[:6].reshape(3, 2) for w in weights]))
    second = reduce_stack(op, torch.stack([w[6:].reshape(2, 2) for w in weights]))
    first[1:] += 3 * second
    return first

STEP = 1e-6


def reduce_stack(op, stack):
    return {hvd.Sum: lambda s: s.sum(0), hvd.Average: lambda s: s.mean(0),
            hvd.Min: lambda s: s.amin(0), hvd.Max: lambda s: s.amax(0),
            hvd.Product: lambda s: s.prod(0)}[op](stack)


def rs_block(full, rank, size):
    rows = [full.shape[0] // size + (1 if k < full.shape[0] % size else 0) for k in range(size)]
    return full[sum(rows[:rank]):sum(rows[:rank + 1])]


def a2a_splits(sender, size):
    return [(sender + d) % 2 + 1 for d in range(size)]


def a2a_reference(xs, rank, size):
    pieces = []
    for sender, x in enumerate(xs):
        splits = a2a_splits(sender, size)
        start = sum(splits[:rank])
        pieces.append(x[start:start + splits[rank]])
    return torch.cat(pieces)


def flat(outputs):
    return torch.cat([o.reshape(-1) for o in outputs])


def cases(size):
    """name -> (distributed fn, reference fn(xs, rank), input shape of rank r)."""
    def allreduce(op, pre=1.0, post=1.0):
        return (lambda x: hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post),
                lambda xs, r: post * reduce_stack(op, pre * torch.stack(xs)),
                lambda r: (3, 2))

    def reducescatter(op, pre=1.0, post=1.0):
        return (lambda x: hvd.reducescatter(x, op=op, prescale_factor=pre,
                                            postscale_factor=post),
                lambda xs, r: rs_block(post * reduce_stack(op, pre * torch.stack(xs)), r, size),
                lambda r: (size + 1, 2))

    return {
        "allreduce_sum_scaled": allreduce(hvd.Sum, 0.5, 3.0),
        "allreduce_average": allreduce(hvd.Average),
        "allreduce_average_scaled": allreduce(hvd.Average, 2.0, 0.25),
        "allreduce_min": allreduce(hvd.Min),
        "allreduce_max_negative_prescale": allreduce(hvd.Max, -2.0),
        "allreduce_product": allreduce(hvd.Product, 1.5),
        "grouped_allreduce": (
            lambda x: flat(hvd.grouped_allreduce([x, x[:1] * 2], op=hvd.Sum)),
            lambda xs, r: flat([torch.stack(xs).sum(0), (torch.stack(xs)[:, :1] * 2).sum(0)]),
            lambda r: (3, 2)),
        "grouped_allreduce_max": (
            lambda x: flat(hvd.grouped_allreduce([x, x[1:] * 3], op=hvd.Max)),
            lambda xs, r: flat([torch.stack(xs).amax(0), (torch.stack(xs)[:, 1:] * 3).amax(0)]),
            lambda r: (3, 2)),
        "allgather": (hvd.allgather, lambda xs, r: torch.cat(xs), lambda r: (r + 1, 2)),
        "grouped_allgather": (
            lambda x: flat(hvd.grouped_allgather([x, x[-1:] ** 2])),
            lambda xs, r: flat([torch.cat(xs), torch.cat([x[-1:] ** 2 for x in xs])]),
            lambda r: (r + 1, 2)),
        "broadcast": (lambda x: hvd.broadcast(x, size - 1), lambda xs, r: xs[size - 1],
                      lambda r: (2, 3)),
        "alltoall": (lambda x: hvd.alltoall(x, splits=a2a_splits(hvd.rank(), size))[0],
                     lambda xs, r: a2a_reference(xs, r, size),
                     lambda r: (sum(a2a_splits(r, size)), 2)),
        "alltoall_even": (hvd.alltoall, lambda xs, r: torch.cat(
            [x[2 * r:2 * r + 2] for x in xs]), lambda r: (2 * size, 1)),
        "reducescatter_sum": reducescatter(hvd.Sum, 2.0, 0.5),
        "reducescatter_average": reducescatter(hvd.Average),
        "reducescatter_min": reducescatter(hvd.Min),
        "reducescatter_product": reducescatter(hvd.Product, 1.0, 2.0),
        "grouped_reducescatter": (
            lambda x: flat(hvd.grouped_reducescatter([x, x * x], op=hvd.Average)),
            lambda xs, r: flat([rs_block(torch.stack(xs).mean(0), r, size),
                                rs_block(torch.stack([x * x for x in xs]).mean(0), r, size)]),
            lambda r: (size + 1, 2)),
    }


CASE_NAMES = list(cases(1))


def horovod_factor(case, size):
    """Horovod's gradient over the gradient of the sum of the ranks' losses."""
    if case in ("allgather", "grouped_allgather", "broadcast"):
        return 1.0 / size
    if case in ("reducescatter_sum", "reducescatter_average", "grouped_reducescatter"):
        return float(size)
    return 1.0


def reference_gradient(reference, xs, weights, rank, size):
    xs = [x.clone().requires_grad_(True) for x in xs]
    loss = sum((reference(xs, r) * weights[r]).sum() for r in range(size))
    loss.backward()
    grad = xs[rank].grad  # None where the output does not depend on this rank
    return reference(xs, rank).detach(), torch.zeros_like(xs[rank]) if grad is None else grad


@pytest.mark.parametrize("case", CASE_NAMES)
def test_gradient(case, rank, size):
    function, reference, in_shape = cases(size)[case]
    tag = f"torch.grad.{case}"
    xs = [float_input(tag, r, in_shape(r)) for r in range(size)]
    out_shapes = [reference(xs, r).shape for r in range(size)]
    weights = [float_input(tag + ".w", r, out_shapes[r]) for r in range(size)]

    x = xs[rank].clone().requires_grad_(True)
    out = function(x)
    (out * weights[rank]).sum().backward()

    def objective(local_input):
        with torch.no_grad():
            local = (function(local_input) * weights[rank]).sum().reshape(1)
            return hvd.allreduce(local, op=hvd.Sum).item()

    numeric = torch.zeros(in_shape(rank), dtype=torch.float64)
    for owner in range(size):
        for i in range(torch.Size(in_shape(owner)).numel()):
            values = []
            for sign in (1, -1):
                probe = xs[rank].clone()
                if rank == owner:
                    probe.view(-1)[i] += sign * STEP
                values.append(objective(probe))
            if rank == owner:
                numeric.view(-1)[i] = (values[0] - values[1]) / (2 * STEP)

    expected_out, expected_grad = reference_gradient(reference, xs, weights, rank, size)
    factor = horovod_factor(case, size)
    torch.testing.assert_close(out.detach(), expected_out, rtol=1e-12, atol=1e-12)
    if case in HOROVOD_OWN and not exact():
        torch.testing.assert_close(x.grad, horovod_gradient(case, weights, rank, size),
                                   rtol=1e-10, atol=1e-12)
        return
    torch.testing.assert_close(x.grad, expected_grad * factor, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(x.grad, numeric * factor, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", [hvd.Min, hvd.Max], ids=["Min", "Max"])
def test_extreme_ties_share_the_gradient(op, rank, size):
    if not exact():
        pytest.skip("HORA_EXACT_REDUCE_GRADIENTS=1 only")
    # element 0 is equal on every rank: each rank gets 1/size of the gradient
    x = float_input("torch.grad.ties", rank, (4,))
    x[0] = 1.5
    x.requires_grad_(True)
    out = hvd.allreduce(x, op=op)
    out.sum().backward()
    xs = [float_input("torch.grad.ties", r, (4,)) for r in range(size)]
    for t in xs:
        t[0] = 1.5
    stack = torch.stack(xs).requires_grad_(True)
    reduce_stack(op, stack).sum().mul(size).backward()
    assert x.grad[0].item() == pytest.approx(1.0)
    torch.testing.assert_close(x.grad, stack.grad[rank])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=str)
def test_low_precision_gradients(dtype, rank, size):
    tag = "torch.grad.low"
    x = float_input(tag, rank, (5,), dtype).requires_grad_(True)
    compressed = x.detach().float().requires_grad_(True)
    out = hvd.allreduce(x, op=hvd.Average)
    (out * (rank + 1)).sum().backward()
    via_fp16 = hvd.allreduce(compressed, op=hvd.Sum, compression=hvd.Compression.fp16)
    via_fp16.sum().backward()
    assert out.dtype == dtype and x.grad.dtype == dtype
    expected = sum(r + 1 for r in range(size)) / size
    torch.testing.assert_close(x.grad.float(), torch.full((5,), expected), rtol=1e-2, atol=1e-2)
    assert compressed.grad.dtype == torch.float32
    assert compressed.grad.tolist() == [float(size)] * 5


def test_named_collectives_name_their_backward(rank, size):
    # the backward collectives of named ops are named after them
    x = float_input("torch.grad.named", rank, (3,)).requires_grad_(True)
    y = hvd.allgather(hvd.allreduce(x, name="torch.grad.named.ar", op=hvd.Sum).unsqueeze(0),
                      name="torch.grad.named.ag")
    # an unnamed collective that rank 0 starts before backward and the
    # others after it: auto-named backward collectives would not match
    handle = hvd.allreduce_async(torch.ones(1), op=hvd.Sum) if rank == 0 else None
    y.sum().backward()
    if rank != 0:
        handle = hvd.allreduce_async(torch.ones(1), op=hvd.Sum)
    extra = hvd.synchronize(handle)
    # allgather's backward averages (ones), allreduce's sums over ranks
    assert x.grad.tolist() == [float(size)] * 3
    assert extra.tolist() == [float(size)]


def test_non_float_inputs_do_not_need_gradients(rank, size):
    x = torch.arange(4, dtype=torch.int64)
    out = hvd.allgather(x)
    assert not out.requires_grad and out.shape == (4 * size,)
