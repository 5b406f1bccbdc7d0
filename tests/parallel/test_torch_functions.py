"""broadcast_parameters and broadcast_optimizer_state: every rank ends with
the root's parameters, buffers, optimizer state and hyper-parameters, and
training continues identically everywhere."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from torch_helpers import float_input  # noqa: E402

OPTIMIZERS = {
    "sgd_momentum": lambda params, lr: torch.optim.SGD(params, lr=lr, momentum=0.9,
                                                       weight_decay=0.01),
    "adam": lambda params, lr: torch.optim.Adam(params, lr=lr, betas=(0.8, 0.95)),
    "adamw": lambda params, lr: torch.optim.AdamW(params, lr=lr, weight_decay=0.1),
}


def make_model(seed, batch_norm=False):
    torch.manual_seed(seed)
    middle = torch.nn.BatchNorm1d(4) if batch_norm else torch.nn.Tanh()
    return torch.nn.Sequential(torch.nn.Linear(3, 4), middle, torch.nn.Linear(4, 1)).double()


def batch(tag, rank, step):
    return float_input(f"{tag}.x.{step}", rank, (4, 3)), float_input(f"{tag}.y.{step}", rank,
                                                                     (4, 1))


def step_on(model, optimizer, data):
    optimizer.zero_grad()
    x, y = data
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()


def flat_state(optimizer):
    """Every state tensor and value, in parameter order, as one float64 vector."""
    values = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            for _, value in sorted(optimizer.state.get(p, {}).items()):
                values.append(torch.as_tensor(value, dtype=torch.float64).reshape(-1))
    return torch.cat(values) if values else torch.zeros(0, dtype=torch.float64)


def flat_module(model):
    return torch.cat([t.detach().double().reshape(-1) for t in model.state_dict().values()])


def identical_everywhere(tensor):
    gathered = hvd.allgather(tensor.unsqueeze(0))
    return all(torch.equal(gathered[0], row) for row in gathered)


@pytest.mark.parametrize("form", ["state_dict", "named_parameters", "parameters"])
def test_broadcast_parameters(form, rank, size):
    root = size - 1
    model = make_model(seed=rank, batch_norm=True)
    model.train()
    model(float_input("torch.bp", rank, (5, 3)))  # running stats differ per rank too
    params = {"state_dict": model.state_dict, "named_parameters": model.named_parameters,
              "parameters": lambda: list(model.parameters())}[form]()
    hvd.broadcast_parameters(params, root_rank=root)

    expected = make_model(seed=root, batch_norm=True)
    expected.train()
    expected(float_input("torch.bp", root, (5, 3)))
    if form == "state_dict":
        for (name, value), (_, want) in zip(model.state_dict().items(),
                                            expected.state_dict().items()):
            assert torch.equal(value, want), name
    else:
        for p, want in zip(model.parameters(), expected.parameters()):
            assert torch.equal(p, want)


def test_broadcast_parameters_errors(rank, size):
    with pytest.raises(ValueError, match="dict"):
        hvd.broadcast_parameters(3, 0)
    with pytest.raises(TypeError, match="not a tensor"):
        hvd.broadcast_parameters({"a": 1.0}, 0)
    with pytest.raises(ValueError, match="repeated"):
        hvd.broadcast_parameters([("a", torch.ones(1)), ("a", torch.ones(1))], 0)


@pytest.mark.parametrize("wrapped", [False, True], ids=["plain", "distributed"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_state_created_lazily_on_other_ranks(kind, wrapped, rank, size):
    # Rank 0 (the root) resumed: it has trained a little on its own and has
    # state; the other ranks have fresh optimizers with other learning rates.
    tag = f"torch.bos.{kind}"
    model = make_model(seed=rank + 10)
    optimizer = OPTIMIZERS[kind](model.parameters(), lr=0.05 if rank == 0 else 0.5)
    if rank == 0:
        for step in range(2):
            step_on(model, optimizer, batch(tag + ".warm", 0, step))
    if wrapped:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    had_state = len(optimizer.state) > 0
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    state_identical = identical_everywhere(flat_state(optimizer))
    lrs = hvd.allgather_object([g["lr"] for g in optimizer.param_groups])
    if not wrapped:
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for step in range(2):
        step_on(model, optimizer, batch(tag, rank, step))
    model_identical = identical_everywhere(flat_module(model))

    # what rank 0 alone would have done on every rank's data
    reference = make_model(seed=10)
    reference_optimizer = OPTIMIZERS[kind](reference.parameters(), lr=0.05)
    for step in range(2):
        step_on(reference, reference_optimizer, batch(tag + ".warm", 0, step))
    for step in range(2):
        parts = [batch(tag, r, step) for r in range(size)]
        step_on(reference, reference_optimizer, (torch.cat([x for x, _ in parts]),
                                                 torch.cat([y for _, y in parts])))
    assert had_state == (rank == 0)
    assert state_identical and model_identical
    assert lrs == [[0.05]] * size
    torch.testing.assert_close(flat_module(model), flat_module(reference), rtol=1e-9,
                               atol=1e-11)
    torch.testing.assert_close(flat_state(optimizer), flat_state(reference_optimizer),
                               rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_fresh_optimizers_stay_fresh_and_hyperparameters_follow_the_root(kind, rank, size):
    tag = f"torch.bos.fresh.{kind}"
    model = make_model(seed=3)
    optimizer = OPTIMIZERS[kind](model.parameters(), lr=0.01 * (rank + 1))
    optimizer.param_groups[0]["weight_decay"] = 0.001 * rank
    hvd.broadcast_optimizer_state(optimizer, root_rank=size - 1)
    empty = len(optimizer.state) == 0
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for step in range(2):
        step_on(model, optimizer, batch(tag, rank, step))
    identical = identical_everywhere(flat_module(model))

    reference = make_model(seed=3)
    reference_optimizer = OPTIMIZERS[kind](reference.parameters(), lr=0.01 * size)
    reference_optimizer.param_groups[0]["weight_decay"] = 0.001 * (size - 1)
    for step in range(2):
        parts = [batch(tag, r, step) for r in range(size)]
        step_on(reference, reference_optimizer, (torch.cat([x for x, _ in parts]),
                                                 torch.cat([y for _, y in parts])))
    assert empty and identical
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * size)
    torch.testing.assert_close(flat_module(model), flat_module(reference), rtol=1e-9,
                               atol=1e-11)


def test_state_the_root_lacks_is_dropped(rank, size):
    model = make_model(seed=4)
    optimizer = OPTIMIZERS["adam"](model.parameters(), lr=0.1)
    if rank != 0:
        step_on(model, optimizer, batch("torch.bos.drop", rank, 0))
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert len(optimizer.state) == 0


def test_broadcast_optimizer_state_errors(rank, size):
    model = make_model(seed=0)
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), 0)
    if size == 1:
        return
    # rank 0 has two parameter groups, the others one: every rank must fail
    params = list(model.parameters())
    groups = [{"params": params[:2]}, {"params": params[2:]}] if rank == 0 else params
    optimizer = torch.optim.SGD(groups, lr=0.1)
    with pytest.raises(ValueError, match="parameter groups"):
        hvd.broadcast_optimizer_state(optimizer, 0)
