"""A small model and data that differ per rank and step, and a training
loop that runs the same steps with any DistributedOptimizer settings, so
that sharded training can be held against replicated training."""

import torch

import hora.torch as hvd
from hora.torch.parameter_sharding import gathered_model


class Net(torch.nn.Module):
    """Parameters of awkward sizes (so shards cut through them), a 0-d one,
    and a channels_last convolution whose weight is not contiguous."""

    def __init__(self, channels_last=False):
        super().__init__()
        torch.manual_seed(7)
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        if channels_last:
            self.conv = self.conv.to(memory_format=torch.channels_last)
        self.hidden = torch.nn.Linear(3 * 16, 13)
        self.out = torch.nn.Linear(13, 5)
        self.gain = torch.nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        h = torch.relu(self.conv(x)).flatten(1)
        return self.out(torch.tanh(self.hidden(h))) * self.gain


def batch(step, rank, k=0):
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + k)
    return torch.randn(6, 2, 4, 4, generator=g), torch.randn(6, 5, generator=g)


def make(optimizer_class=torch.optim.Adam, sharding=None, channels_last=False, lr=0.01,
         optimizer_options=None, **options):
    model = Net(channels_last)
    if sharding == "parameters":
        options["model"] = model
    optimizer = hvd.DistributedOptimizer(
        optimizer_class(model.parameters(), lr=lr, **(optimizer_options or {})),
        named_parameters=model.named_parameters(), sharding=sharding, **options)
    return model, optimizer


def train(model, optimizer, steps=4, passes=1, first_step=0, clip=None):
    """Runs ``steps`` steps of ``passes`` backward passes each; returns the
    total gradient norms ``clip`` reported (when clipping)."""
    norms = []
    for step in range(first_step, first_step + steps):
        for k in range(passes):
            x, y = batch(step, hvd.rank(), k)
            torch.nn.functional.mse_loss(model(x), y).backward()
        if clip is not None:
            norms.append(float(optimizer.clip_grad_norm_(clip)))
        optimizer.step()
        optimizer.zero_grad()
    return norms


def parameters(model):
    """Copies of the model's parameters (whole, also where they are held
    sharded by sharding="parameters")."""
    with gathered(model):
        return [p.detach().clone() for p in model.parameters()]


def gathered(model, writeback=False):
    """The parameters of ``model`` whole while the block runs (stage 3
    gathers them; collective), what was written into them kept with
    ``writeback``."""
    return gathered_model(model, writeback)


def model_option(sharding, model):
    """The keyword arguments a wrap with ``sharding`` needs for ``model``."""
    return {"model": model} if sharding == "parameters" else {}


def assert_same(got, expected, exact=False, rtol=1e-5):
    """Bit-identical where the reduction order is the same (``exact``);
    otherwise within a few float32 roundings per step, summed in another
    order (a wrong reduction is off by far more). On a CPU where PyTorch
    runs AVX-512 kernels the differences reach a few 1e-6 relative after
    the test's steps (2026-11-27), and ``rtol`` is wider for optimizers
    that divide by a running mean square (RMSprop), which magnify them."""
    for a, b in zip(got, expected):
        if exact:
            assert torch.equal(a, b), (a - b).abs().max()
        else:
            torch.testing.assert_close(a, b, rtol=rtol, atol=1e-6)


def assert_identical_on_every_rank(model):
    flat = torch.cat([p.reshape(-1) for p in parameters(model)])
    gathered = hvd.allgather(flat.unsqueeze(0), name="sharding.test.identical")
    for row in gathered:
        assert torch.equal(row, flat)
