"""Local SGD (``DistributedOptimizer(local_steps=H)``): each rank steps on
its own gradients, and after every H steps the parameters are averaged
(or, with ``outer_optimizer``, applied to the anchor DiLoCo's way); checked
against a simulation of every rank in one process."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402

H = 3
STEPS = 7  # two averagings and a local step after them


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def batch(rank, step):
    generator = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(5, 4, generator=generator), torch.randn(5, 1, generator=generator)


def local_step(net, opt, rank, step):
    opt.zero_grad()
    data, target = batch(rank, step)
    torch.nn.functional.mse_loss(net(data), target).backward()
    opt.step()


def outer(tensors):
    return torch.optim.SGD(tensors, lr=0.7, momentum=0.9, nesterov=True)


def simulate(size, steps, with_outer):
    """Every rank's parameters after each step, all ranks in this process."""
    nets = [model() for _ in range(size)]
    opts = [torch.optim.SGD(n.parameters(), lr=0.1) for n in nets]
    anchor = [p.detach().clone() for p in nets[0].parameters()]
    outer_opt = outer(anchor) if with_outer else None
    history = []
    for step in range(steps):
        for rank in range(size):
            local_step(nets[rank], opts[rank], rank, step)
        if (step + 1) % H == 0:
            with torch.no_grad():
                means = [torch.stack(ps).mean(dim=0)
                         for ps in zip(*[list(n.parameters()) for n in nets])]
                if outer_opt is not None:
                    for a, mean in zip(anchor, means):
                        a.grad = a - mean
            if outer_opt is not None:
                outer_opt.step()
                means = anchor
            with torch.no_grad():
                for n in nets:
                    for p, mean in zip(n.parameters(), means):
                        p.copy_(mean)
        history.append([[p.detach().clone() for p in n.parameters()] for n in nets])
    return history


@pytest.mark.parametrize("with_outer", [False, True], ids=["averaging", "diloco"])
def test_matches_a_simulation_of_every_rank(rank, size, with_outer):
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters(), local_steps=H,
                                   outer_optimizer=outer if with_outer else None)
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    expected = simulate(size, STEPS, with_outer)
    for step in range(STEPS):
        local_step(net, opt, rank, step)
        for mine, reference in zip(net.parameters(), expected[step][rank]):
            torch.testing.assert_close(mine.detach(), reference, rtol=1e-5, atol=1e-6)
        if (step + 1) % H == 0:
            flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
            for other in hvd.allgather(flat.unsqueeze(0), name=f"local_sgd.check.{step}"):
                assert torch.equal(other, flat)


def test_bad_arguments_raise():
    net = model()

    def wrap(**kwargs):
        return hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                        named_parameters=net.named_parameters(), **kwargs)

    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="local_steps must be an int >= 1"):
            wrap(local_steps=bad)
    with pytest.raises(ValueError, match="pass local_steps > 1 too"):
        wrap(outer_optimizer=outer)
    with pytest.raises(TypeError, match="outer_optimizer must be a function"):
        wrap(local_steps=4, outer_optimizer=0.7)
    with pytest.raises(ValueError, match="cannot be combined with sharding"):
        wrap(local_steps=4, sharding="optimizer_state")
    with pytest.raises(ValueError, match="compression=.* does not apply"):
        wrap(local_steps=4, compression=hvd.Compression.fp16)
    with pytest.raises(ValueError, match="op=Sum does not apply"):
        wrap(local_steps=4, op=hvd.Sum)


def test_a_new_world_counts_again_from_its_parameters(rank, size):
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters(), local_steps=H,
                                   outer_optimizer=outer)
    for step in range(H + 1):
        local_step(net, opt, rank, step)
    assert opt._hora_local_count == H + 1 and opt._hora_anchor is not None
    hvd.elastic.TorchState(model=net, optimizer=opt).sync()
    assert opt._hora_local_count == 0 and opt._hora_anchor is None
    local_step(net, opt, rank, 0)
    # the new anchor is the parameters as synchronized, the same everywhere
    flat = torch.cat([a.reshape(-1) for a in opt._hora_anchor])
    for other in hvd.allgather(flat.unsqueeze(0), name="local_sgd.anchor.check"):
        assert torch.equal(other, flat)


def test_resuming_with_broadcast_optimizer_state_keeps_the_ranks_in_step(rank, size):
    # rank 0 loads an optimizer checkpoint, the others have no state: the
    # step broadcast_optimizer_state runs on them to make it does not count
    # towards their averaging (else they would average a step early, and
    # at the end make one averaging rank 0 never makes)
    net = model()
    opt = hvd.DistributedOptimizer(torch.optim.Adam(net.parameters(), lr=0.01),
                                   named_parameters=net.named_parameters(), local_steps=H)
    if rank == 0:
        donor = model()
        donor_opt = torch.optim.Adam(donor.parameters(), lr=0.01)
        local_step(donor, donor_opt, 0, 99)
        opt.load_state_dict(donor_opt.state_dict())
    hvd.broadcast_parameters(net.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert hvd.allgather_object(opt._hora_local_count, name="local_sgd.resume.count") == [0] * size
    for step in range(2 * H):
        local_step(net, opt, rank, step)
    flat = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    for other in hvd.allgather(flat.unsqueeze(0), name="local_sgd.resume.check"):
        assert torch.equal(other, flat)


@pytest.mark.parametrize("with_outer", [False, True], ids=["averaging", "diloco"])
def test_parameters_of_a_group_added_later_are_averaged(rank, size, with_outer):
    net, head = model(), torch.nn.Linear(1, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                   named_parameters=net.named_parameters(), local_steps=H,
                                   outer_optimizer=outer if with_outer else None)
    local_step(net, opt, rank, 0)
    opt.add_param_group({"params": head.parameters(), "lr": 0.05})
    for step in range(1, 2 * H):
        opt.zero_grad()
        data, target = batch(rank, step)
        head(net(data)).sum().backward()
        opt.step()
    flat = torch.cat([p.detach().reshape(-1) for p in head.parameters()])
    for other in hvd.allgather(flat.unsqueeze(0), name=f"local_sgd.added.{with_outer}"):
        assert torch.equal(other, flat)
