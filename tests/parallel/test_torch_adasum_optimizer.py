"""DistributedOptimizer(op=Adasum) in hora.torch, against a simulation of
Horovod's delta optimizer: every rank steps its own optimizer (its own
momentum) on its own gradient, the per-parameter deltas are combined with
the Adasum tree over the ranks, and every rank ends on the same weights.
Sizes that are not a power of two are refused when the optimizer is made."""

import zlib

import numpy as np
import pytest
import torch

from adasum_reference import tree
import hora.torch as hvd




def data(rank, step):
    rng = np.random.default_rng([zlib.crc32(b"adasum-opt"), rank, step])
    return (torch.tensor(rng.normal(size=(8, 5))), torch.tensor(rng.normal(size=(8, 3))))


def model():
    torch.manual_seed(3)
    return torch.nn.Linear(5, 3).double()


def power_of_two(n):
    return n & (n - 1) == 0


def simulate(size, steps, lr, momentum):
    """Every rank's optimizer, run here: the combined deltas of each step."""
    nets = [model() for _ in range(size)]
    opts = [torch.optim.SGD(n.parameters(), lr=lr, momentum=momentum) for n in nets]
    for step in range(steps):
        deltas = []
        for r, (net, opt) in enumerate(zip(nets, opts)):
            x, y = data(r, step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            before = [p.detach().clone() for p in net.parameters()]
            opt.step()
            deltas.append([(p.detach() - b).reshape(-1).numpy()
                           for p, b in zip(net.parameters(), before)])
        combined = [tree([deltas[r][k] for r in range(size)]) for k in range(len(deltas[0]))]
        for net, d in zip(nets, deltas):
            with torch.no_grad():
                for p, own, both in zip(net.parameters(), d, combined):
                    p.add_(torch.from_numpy(both - own).reshape(p.shape))
    return [p.detach() for p in nets[0].parameters()]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_adasum_optimizer_matches_the_delta_simulation(rank, size, momentum):
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=momentum)
    if not power_of_two(size):
        with pytest.raises(ValueError, match=f"power of two.*{size}"):
            hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(), op=hvd.Adasum)
        return
    opt = hvd.DistributedOptimizer(opt, named_parameters=net.named_parameters(), op=hvd.Adasum)
    for step in range(3):
        x, y = data(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
    want = simulate(size, 3, 0.1, momentum)
    for p, w in zip(net.parameters(), want):
        torch.testing.assert_close(p.detach(), w, rtol=1e-9, atol=1e-12)
    weights = hvd.allgather_object([p.detach().numpy().tobytes() for p in net.parameters()])
    assert all(w == weights[0] for w in weights)  # identical bits on every rank


def test_adasum_optimizer_rules(rank, size):
    if not power_of_two(size) or size == 1:
        pytest.skip("needs a power of two above one")
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters(), op=hvd.Adasum)
    x, y = data(rank, 0)
    torch.nn.functional.mse_loss(net(x), y).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    with pytest.raises(AssertionError, match="skip_synchronize"):
        with opt.skip_synchronize():
            pass
    opt.step()
    opt.zero_grad()
    # a parameter without a gradient still takes part (its delta is zero)
    torch.nn.functional.mse_loss(net.weight.sum() * torch.ones(1, dtype=torch.double),
                                 torch.zeros(1, dtype=torch.double)).backward()
    bias = net.bias.detach().clone()
    opt.step()
    torch.testing.assert_close(net.bias.detach(), bias)


def test_adasum_on_one_rank_steps_locally(rank, size):
    if size != 1:
        pytest.skip("one rank")
    net = model()
    plain = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=net.named_parameters(), op=hvd.Adasum)
    ref = torch.optim.SGD(plain.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        x, y = data(0, step)
        for n, o in ((net, opt), (plain, ref)):
            o.zero_grad()
            torch.nn.functional.mse_loss(n(x), y).backward()
            o.step()
    for p, q in zip(net.parameters(), plain.parameters()):
        torch.testing.assert_close(p, q)
