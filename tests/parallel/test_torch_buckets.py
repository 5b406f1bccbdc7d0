"""DistributedOptimizer's gradient buckets: whatever the packing (mixed
dtypes, a sparse gradient, one bucket or one allreduce per gradient), the
reduced gradients are the same, and an error inside a bucket names the
parameter on every rank."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from torch_helpers import float_input, needs_ranks  # noqa: E402


class Mixed(torch.nn.Module):
    """Gradients of three kinds: a sparse embedding, float32 and float64."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.embedding = torch.nn.Embedding(8, 4, sparse=True)
        self.single = torch.nn.Linear(4, 5)
        self.wide = torch.nn.Linear(5, 3).double()

    def forward(self, indices):
        return self.wide(torch.tanh(self.single(self.embedding(indices))).double())


def reduced_gradients(rank, bucket_bytes):
    model = Mixed()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         bucket_bytes=bucket_bytes)
    indices = torch.tensor([rank % 8, (rank * 3 + 1) % 8, 5])
    target = float_input("torch.buckets.target", rank, (3, 3))
    torch.nn.functional.mse_loss(model(indices), target).backward()
    optimizer.synchronize()
    return {name: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
            for name, p in model.named_parameters()}, model


@pytest.mark.parametrize("bucket_bytes", [None, 64, 1 << 20])
def test_buckets_reduce_the_same_gradients_as_one_allreduce_each(bucket_bytes, rank, size):
    expected, _ = reduced_gradients(rank, 0)
    got, model = reduced_gradients(rank, bucket_bytes)
    assert model.embedding.weight.grad.is_sparse  # handed back as it came
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7)


def test_a_mismatch_inside_a_bucket_names_the_parameter_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    width = 6 if rank == 0 else 7
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(float_input("torch.buckets.mismatch", rank, (3, 4)).float()).sum().backward()
    with pytest.raises(hvd.HoraMismatchError) as caught:
        optimizer.step()
    message = str(caught.value)
    assert "Mismatched shape" in message and "parameter '1.weight'" in message, message
    assert "[2, 6]" in message and "[2, 7]" in message, message
    # the optimizer is usable again once the models agree
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(float_input("torch.buckets.after", rank, (3, 4)).float()).sum().backward()
    optimizer.step()


class Stack(torch.nn.Module):
    """Four float32 layers: one bucket when bucket_bytes allows."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.layers = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(),
                                          torch.nn.Linear(6, 3))

    def forward(self, x):
        return self.layers(x)


def _expected_step_gradients(rank, size, step, passes=1):
    """What every gradient averages to, computed without buckets."""
    model = Stack()
    for p in model.parameters():
        p.grad = None
    for k in range(passes):
        for r in range(size):
            x = float_input(f"flat.{step}.{k}", r, (5, 4)).float()
            (model(x).pow(2).sum() / size).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_buckets_gradients_are_views_into_one_flat_buffer(set_to_none, rank, size):
    needs_ranks(size)
    model = Stack()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(),
                                         bucket_bytes=1 << 20)
    seen = None
    for step in range(3):
        optimizer.zero_grad(set_to_none=set_to_none)
        model(float_input(f"flat.{step}.0", rank, (5, 4)).float()).pow(2).sum().backward()
        optimizer.step()
        grads = [p.grad for p in model.parameters()]
        # one storage for the bucket, the gradients laid end to end in it
        assert len({g.untyped_storage().data_ptr() for g in grads}) == 1
        if not set_to_none and seen is not None:
            # accumulated into the views: the very same tensors, nothing copied in
            assert all(g is s for g, s in zip(grads, seen))
        seen = grads
        expected = _expected_step_gradients(rank, size, step)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-6)


def test_flat_buckets_with_backward_passes_per_step(rank, size):
    model = Stack()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                         named_parameters=model.named_parameters(),
                                         bucket_bytes=1 << 20, backward_passes_per_step=2)
    for step in range(2):
        optimizer.zero_grad(set_to_none=step == 0)
        for k in range(2):
            model(float_input(f"flat.{step}.{k}", rank, (5, 4)).float()).pow(2).sum().backward()
        optimizer.step()
        expected = _expected_step_gradients(rank, size, step, passes=2)
        for name, p in model.named_parameters():
            torch.testing.assert_close(p.grad, expected[name], rtol=1e-5, atol=1e-6)


def test_channels_last_gradients_in_a_bucket(rank, size):
    def gradients(bucket_bytes):
        torch.manual_seed(7)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 2, 1))
        model = model.to(memory_format=torch.channels_last)
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                             named_parameters=model.named_parameters(),
                                             bucket_bytes=bucket_bytes)
        x = float_input("flat.channels_last", rank, (2, 3, 6, 6)).float()
        model(x.to(memory_format=torch.channels_last)).pow(2).sum().backward()
        assert not model[0].weight.grad.is_contiguous()  # the case under test
        optimizer.step()
        return [p.grad.clone() for p in model.parameters()]

    for got, want in zip(gradients(1 << 20), gradients(0)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
