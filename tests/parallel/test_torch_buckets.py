"""DistributedOptimizer's gradient buckets: whatever the packing (mixed
dtypes, a sparse gradient, one bucket or one allreduce per gradient), the
reduced gradients are the same, and an error inside a bucket names the
parameter on every rank."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from torch_helpers import float_input  # noqa: E402


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
