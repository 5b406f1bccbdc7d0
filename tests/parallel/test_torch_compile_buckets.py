"""``hora.torch.compile``: the compiled graph is cut where
DistributedOptimizer's buckets end, so that a bucket's allreduce starts
while the backward of the graph before it still runs; training through it
gives what eager training gives, on every rank."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from torch_helpers import needs_ranks  # noqa: E402

WIDTH = 32
LAYER_BYTES = (WIDTH * WIDTH + WIDTH) * 4  # one Linear's parameters


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(6)])


def compiled_backward_nodes(loss):
    """How many compiled backward functions the autograd graph holds."""
    count, seen, stack = 0, set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        count += "CompiledFunctionBackward" in type(node).__name__
        stack.extend(child for child, _ in node.next_functions)
    return count


def optimizer_for(net, bucket_bytes):
    return hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                    named_parameters=net.named_parameters(),
                                    bucket_bytes=bucket_bytes)


def batch(rank, step):
    generator = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(4, WIDTH, generator=generator)


def test_buckets_start_before_the_backward_of_the_first_layers(rank, size):
    needs_ranks(size)
    torch._dynamo.reset()
    net = model()
    bucket_bytes = 2 * LAYER_BYTES  # three buckets, the first (last layers) 2 layers
    opt = optimizer_for(net, bucket_bytes)
    forward = hvd.compile(net, backend="aot_eager", bucket_bytes=bucket_bytes)
    for step in range(2):
        opt.zero_grad()
        x = batch(rank, step).requires_grad_()
        started = []
        # the input's gradient comes out of the first layers' backward: by
        # then the last layers' bucket is on its way
        x.register_hook(lambda grad, started=started: started.append(
            sum(handle is not None for handle in opt._hora_pending.values())))
        loss = forward(x).square().sum()
        assert compiled_backward_nodes(loss) >= 3
        loss.backward()
        opt.step()
        assert started and started[0] >= 1, started


def test_a_whole_graph_reduces_only_after_its_backward(rank, size):
    # the contrast the test above relies on: plain torch.compile hands over
    # every gradient at the end, so no bucket is complete before the input's
    torch._dynamo.reset()
    net = model()
    forward = hvd.compile(net, backend="aot_eager", bucket_bytes=0)
    loss = forward(batch(rank, 0)).sum()
    assert compiled_backward_nodes(loss) == 1


def test_training_matches_eager_on_every_rank(rank, size):
    bucket_bytes = 2 * LAYER_BYTES
    results = []
    for compiled in (False, True):
        torch._dynamo.reset()
        net = model()
        opt = optimizer_for(net, bucket_bytes)
        forward = (hvd.compile(net, backend="aot_eager", bucket_bytes=bucket_bytes, fullgraph=True)
                   if compiled else net)
        for step in range(3):
            opt.zero_grad()
            forward(batch(rank, step)).square().mean().backward()
            opt.step()
        results.append(torch.cat([p.detach().reshape(-1) for p in net.parameters()]))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-6)
    gathered = hvd.allgather(results[1].unsqueeze(0), name="compile_buckets.params")
    for other in gathered:
        torch.testing.assert_close(other, results[1], rtol=0, atol=0)


def test_decorator_form_and_inductor(rank, size):
    torch._dynamo.reset()

    @hvd.compile(bucket_bytes=LAYER_BYTES)
    def double(t):
        return t * 2 + 1

    t = torch.arange(6.0)
    torch.testing.assert_close(double(t), t * 2 + 1)


def test_bad_arguments_raise():
    net = model()
    for bad in (-1, 1.5, True, "25MB"):
        with pytest.raises(ValueError, match="bucket_bytes must be an int >= 0"):
            hvd.compile(net, bucket_bytes=bad)
    with pytest.raises(RuntimeError, match="either mode or options"):
        hvd.compile(net, mode="max-autotune", options={"max_autotune": True})
