"""hora.torch's collectives inside ``torch.compile``: with ``fullgraph=True``
they trace as ``torch.ops.hora.*`` graph nodes (no graph break), give what
eager mode gives, and differentiate with Horovod's gradients, also under
compiled autograd and in a ``torch.export``ed program; bad input raises
Horovod's exception classes from compiled code too.

The compiled graphs run the same collectives as eager mode, so these run
once per world size (not again for every forced allreduce path)."""

import os

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from hora.common.exceptions import HoraInvalidArgumentError, HoraTypeError  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("HORA_ALLREDUCE_ALGORITHM", "auto") != "auto"
    or os.environ.get("HORA_CPU_KERNELS", "auto") != "auto",
    reason="compiled graphs call the same collectives as eager mode; run with the default path")


def compiled(fn, backend="aot_eager"):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)


def inputs(rank, rows=2):
    x = torch.arange(rows * 3, dtype=torch.float32).reshape(rows, 3) + 10 * rank
    return x.requires_grad_()


def forward_all(x, rank, size):
    """Every differentiable collective, unnamed (named by call order)."""
    summed = hvd.allreduce(x * 2, op=hvd.Sum)
    largest = hvd.allreduce(x, op=hvd.Max)
    uneven = hvd.allgather(summed[: rank % 2 + 1])  # ranks send different row counts
    gathered = hvd.allgather(summed)
    root = hvd.broadcast(gathered, root_rank=size - 1)
    block = hvd.reducescatter(root, op=hvd.Sum)
    group = hvd.grouped_allreduce([block, largest], op=hvd.Average)
    splits = [1, 1] + [0] * (size - 2) if size > 1 else [2]
    swapped, received = hvd.alltoall(largest * (rank + 1), splits=splits)
    loss = (group[0] * 3).sum() + group[1].sum() + swapped.square().sum() + uneven.sum()
    return loss, received


def test_every_collective_traces_in_one_graph_and_matches_eager(rank, size):
    x = inputs(rank)
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    traced = torch.compile(lambda t: forward_all(t, rank, size), fullgraph=True,
                           backend=backend)
    loss, received = traced(x)
    assert len(graphs) == 1  # one graph: no break
    graph_ops = {str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"}
    assert {"hora.allreduce.default", "hora.allgather.default", "hora.broadcast.default",
            "hora.reducescatter.default", "hora.grouped_allreduce.default",
            "hora.alltoall.default"} <= graph_ops, graph_ops
    loss.backward()
    grad = x.grad.clone()
    x.grad = None
    eager_loss, eager_received = forward_all(x, rank, size)
    eager_loss.backward()
    torch.testing.assert_close(loss, eager_loss)
    torch.testing.assert_close(received, eager_received)
    torch.testing.assert_close(grad, x.grad)


def test_named_and_in_place_calls(rank, size):
    def step(t):
        total = hvd.allreduce(t, name="compile.named", op=hvd.Sum)
        t = t.clone()
        hvd.allreduce_(t, name="compile.inplace", op=hvd.Average)
        hvd.broadcast_(t, root_rank=0, name="compile.inplace.bcast")
        return total, t

    x = torch.full((4,), float(rank))
    total, averaged = compiled(step)(x)
    torch.testing.assert_close(total, torch.full((4,), float(sum(range(size)))))
    torch.testing.assert_close(averaged, torch.full((4,), (size - 1) / 2))


def test_async_forms_return_finished_handles_inside_the_graph(rank, size):
    def step(t):
        handles = [hvd.allreduce_async(t, name="compile.async.sum", op=hvd.Sum),
                   hvd.allgather_async(t, name="compile.async.gather"),
                   hvd.broadcast_async(t, root_rank=0, name="compile.async.bcast"),
                   hvd.reducescatter_async(t, name="compile.async.rs", op=hvd.Sum),
                   hvd.alltoall_async(t, name="compile.async.a2a"),
                   hvd.grouped_allreduce_async([t, t * 2], name="compile.async.group",
                                               op=hvd.Sum)]
        polled = [hvd.poll(h) for h in handles]
        results = [hvd.synchronize(h) for h in handles]
        u = t.clone()
        hvd.synchronize(hvd.allreduce_async_(u, name="compile.async.inplace", op=hvd.Sum))
        v = [t.clone(), t.clone()]
        hvd.grouped_allreduce_(v, name="compile.async.group_", op=hvd.Sum)
        return results, u, v, polled

    x = torch.arange(size * 2, dtype=torch.float32) + rank
    graphs = []

    def backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward

    torch._dynamo.reset()
    got, u, v, polled = torch.compile(step, fullgraph=True, backend=backend)(x)
    assert len(graphs) == 1 and all(polled)  # finished as soon as started
    want, u_eager, v_eager, _ = step(x)
    for a, b in zip(got[:4] + [got[4][0]] + got[5], want[:4] + [want[4][0]] + want[5]):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(u, u_eager)
    for a, b in zip(v, v_eager):
        torch.testing.assert_close(a, b)


def test_inductor_compiles_a_model_that_allreduces(rank, size):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)

    def forward(t):
        return hvd.allreduce(model(t), name="compile.inductor", op=hvd.Average).relu().sum()

    x = torch.full((3, 4), float(rank + 1))
    loss = compiled(forward, backend="inductor")(x)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    forward(x).backward()
    torch.testing.assert_close(loss, forward(x))
    for got, want in zip(grads, [p.grad for p in model.parameters()]):
        torch.testing.assert_close(got, want)


def test_compiled_autograd_runs_the_backward_collectives(rank, size):
    x = inputs(rank)

    def loss_of(t):
        return (hvd.allgather(t, name="compile.ca.gather") ** 2).sum()

    loss_of(x).backward()
    want = x.grad.clone()
    x.grad = None
    torch._dynamo.reset()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="aot_eager")):
        compiled(loss_of)(x).backward()
    torch.testing.assert_close(x.grad, want)


def test_an_exported_program_holds_the_collective(rank, size):
    class Reduce(torch.nn.Module):
        def forward(self, t):
            return hvd.allreduce(t, name="compile.export", op=hvd.Sum) + 1

    x = torch.full((2,), float(rank))
    program = torch.export.export(Reduce(), (x,))
    assert "torch.ops.hora.allreduce.default" in str(program.graph_module.code)
    torch.testing.assert_close(program.module()(x), torch.full((2,), sum(range(size)) + 1.0))


def test_bad_input_raises_horovod_classes_from_compiled_code(rank, size):
    with pytest.raises(HoraTypeError, match="complex64 is not supported"):
        compiled(lambda t: hvd.allreduce(t, name="compile.bad.dtype"))(
            torch.zeros(2, dtype=torch.complex64))
    unregistered = hvd.ProcessSet([0])
    with pytest.raises(HoraInvalidArgumentError, match="not registered"):
        compiled(lambda t: hvd.allreduce(t, name="compile.bad.set", process_set=unregistered))(
            torch.zeros(2))
    # nothing was left behind: the names work
    total = compiled(lambda t: hvd.allreduce(t, name="compile.bad.dtype", op=hvd.Sum))(
        torch.ones(2))
    torch.testing.assert_close(total, torch.full((2,), float(size)))
