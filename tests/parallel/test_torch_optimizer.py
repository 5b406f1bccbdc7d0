"""DistributedOptimizer: training on every rank equals single-process
training on the concatenated batch, and the wrapper behaves like the
optimizer it wraps. Each rank computes the single-process reference itself
from every rank's data."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from torch_helpers import float_input, needs_ranks  # noqa: E402

STEPS = 4
ROWS = 3

OPTIMIZERS = {
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9,
                                                   weight_decay=0.01),
    "adam": lambda params: torch.optim.Adam(params, lr=0.01),
    "adamw": lambda params: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
}


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, 2)).double()


def batch(tag, rank, step, rows=ROWS):
    return (float_input(f"{tag}.x.{step}", rank, (rows, 4)),
            float_input(f"{tag}.y.{step}", rank, (rows, 2)))


def global_batch(tag, size, step, rows=ROWS):
    pieces = [batch(tag, r, step, rows) for r in range(size)]
    return torch.cat([x for x, _ in pieces]), torch.cat([y for _, y in pieces])


def loss_of(model, data, scale=1.0):
    x, y = data
    return torch.nn.functional.mse_loss(model(x), y) * scale


def train(model, optimizer, batches, scale=1.0):
    for data in batches:
        optimizer.zero_grad()
        loss_of(model, data, scale).backward()
        optimizer.step()


def flat_parameters(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_every_rank(tensor):
    gathered = hvd.allgather(tensor.unsqueeze(0))
    return all(torch.equal(gathered[0], row) for row in gathered)


CONFIGS = {
    "sgd_momentum": ("sgd_momentum", {}),
    "adam": ("adam", {}),
    "adamw_two_groups": ("adamw", {"groups": 2}),
    "sgd_explicit_group": ("sgd_momentum", {"groups": "first_layer"}),
    "sgd_predivide": ("sgd_momentum", {"gradient_predivide_factor": 2.0}),
    "adam_unnamed": ("adam", {"named": False}),
    "sgd_sum": ("sgd_momentum", {"op": "sum"}),
    "sgd_per_gradient": ("sgd_momentum", {"bucket_bytes": 0}),
    "adam_small_buckets": ("adam", {"bucket_bytes": 100}),  # buckets of one and of two
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_training_matches_single_process(config, rank, size):
    tag = f"torch.opt.{config}"
    kind, options = CONFIGS[config]
    options = dict(options)
    model = make_model()
    kwargs = {}
    if options.pop("named", True):
        kwargs["named_parameters"] = model.named_parameters()
    if options.get("groups") == "first_layer":
        options["groups"] = [list(model[0].parameters())]
    scale = 1.0
    if options.pop("op", None) == "sum":
        kwargs["op"] = hvd.Sum
        scale = size  # Sum of the ranks' mean losses = size x the global mean loss
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS[kind](model.parameters()), **kwargs,
                                         **options)
    train(model, optimizer, [batch(tag, rank, s) for s in range(STEPS)])
    identical = same_on_every_rank(flat_parameters(model))

    reference = make_model()
    train(reference, OPTIMIZERS[kind](reference.parameters()),
          [global_batch(tag, size, s) for s in range(STEPS)], scale)
    assert identical
    torch.testing.assert_close(flat_parameters(model), flat_parameters(reference),
                               rtol=1e-9, atol=1e-11)
    assert not torch.equal(flat_parameters(model), flat_parameters(make_model()))


def test_fp16_compression_training_is_close(rank, size):
    tag = "torch.opt.fp16"
    model = make_model()
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS["sgd_momentum"](model.parameters()),
                                         named_parameters=model.named_parameters(),
                                         compression=hvd.Compression.fp16)
    train(model, optimizer, [batch(tag, rank, s) for s in range(STEPS)])
    identical = same_on_every_rank(flat_parameters(model))
    reference = make_model()
    train(reference, OPTIMIZERS["sgd_momentum"](reference.parameters()),
          [global_batch(tag, size, s) for s in range(STEPS)])
    assert identical
    torch.testing.assert_close(flat_parameters(model), flat_parameters(reference),
                               rtol=1e-2, atol=1e-3)


def test_backward_passes_per_step_equals_one_step_on_twice_the_data(rank, size):
    tag = "torch.opt.passes"
    model = make_model()
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS["sgd_momentum"](model.parameters()),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=2)
    for step in range(STEPS):
        optimizer.zero_grad()
        for half in range(2):
            # accumulated gradients are summed: halve each pass's mean loss
            loss_of(model, batch(tag, rank, 2 * step + half), 0.5).backward()
        optimizer.step()
    identical = same_on_every_rank(flat_parameters(model))

    reference = make_model()
    reference_optimizer = OPTIMIZERS["sgd_momentum"](reference.parameters())
    doubled = []
    for step in range(STEPS):
        parts = [global_batch(tag, size, 2 * step + half) for half in range(2)]
        doubled.append((torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])))
    train(reference, reference_optimizer, doubled)
    assert identical
    torch.testing.assert_close(flat_parameters(model), flat_parameters(reference),
                               rtol=1e-9, atol=1e-11)


class TwoBranches(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(99)
        self.a = torch.nn.Linear(3, 1).double()
        self.b = torch.nn.Linear(3, 1).double()
        self.never = torch.nn.Linear(3, 1).double()

    def forward(self, x, use_b):
        out = self.a(x)
        return out + self.b(x) if use_b else out


def test_unused_parameters_are_reduced_with_zeros(rank, size):
    tag = "torch.opt.unused"
    model = TwoBranches()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    x = float_input(tag, rank, (4, 3))
    model(x, use_b=rank == 0).sum().backward()  # only rank 0 reaches branch b
    optimizer.step()
    b_grad = model.b.weight.grad.clone()
    never_grad = model.never.weight.grad
    identical = same_on_every_rank(flat_parameters(model))

    x0 = float_input(tag, 0, (4, 3))
    assert identical
    torch.testing.assert_close(b_grad, x0.sum(0, keepdim=True) / size)
    if size == 1:
        # one rank reduces nothing, as in Horovod: the optimizer is the
        # wrapped one, and a gradient never produced stays None
        assert never_grad is None
    else:
        assert torch.equal(never_grad, torch.zeros_like(never_grad))


def test_zero_grad_between_backward_and_step_is_an_error(rank, size):
    needs_ranks(size)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    loss_of(model, batch("torch.opt.zero", rank, 0)).backward()
    with pytest.raises(RuntimeError, match="zero_grad.*before optimizer.step"):
        optimizer.zero_grad()
    optimizer.step()
    optimizer.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_too_many_backward_passes_is_an_error(rank, size):
    needs_ranks(size)
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    loss_of(model, batch("torch.opt.twice", rank, 0)).backward()
    with pytest.raises(RuntimeError, match="backward_passes_per_step"):
        loss_of(model, batch("torch.opt.twice", rank, 1)).backward()
    optimizer.step()  # completes the reductions that did start
    optimizer.set_backward_passes_per_step(2)
    assert optimizer.backward_passes_per_step == 2


def test_argument_errors(rank, size):
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="unique.*0.weight"):
        hvd.DistributedOptimizer(sgd, named_parameters=named + [("0.weight", named[0][1])])
    with pytest.raises(ValueError, match="were not named"):
        hvd.DistributedOptimizer(sgd, named_parameters=named[1:])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[p for _, p in named])
    with pytest.raises(ValueError, match="tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("", p) for _, p in named])
    if size & (size - 1):
        with pytest.raises(ValueError, match="Adasum needs a number of ranks that is a power"):
            hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
    with pytest.raises(ValueError, match="Average, Sum or Adasum"):
        hvd.DistributedOptimizer(sgd, op=hvd.Max)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(sgd, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups must consist of torch.Tensor"):
        hvd.DistributedOptimizer(sgd, groups=[["weight"]])
    with pytest.raises(ValueError, match="groups should be a non-negative integer"):
        hvd.DistributedOptimizer(sgd, groups=0)
    with pytest.raises(ValueError, match="process set"):
        hvd.DistributedOptimizer(sgd, process_set=object())
    with pytest.raises(TypeError, match="torch.optim.Optimizer"):
        hvd.DistributedOptimizer(model)
    wrapped = hvd.DistributedOptimizer(sgd)
    with pytest.raises(ValueError, match="already"):
        hvd.DistributedOptimizer(wrapped)


def test_wrapper_behaves_like_the_wrapped_optimizer(rank, size):
    tag = "torch.opt.wrapper"
    model = make_model()
    extra = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    adam = torch.optim.Adam(model.parameters(), lr=0.02, betas=(0.8, 0.99))
    optimizer = hvd.DistributedOptimizer(adam, named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    assert isinstance(optimizer, torch.optim.Adam) and type(optimizer).__name__ == "Adam"
    assert optimizer.param_groups is adam.param_groups and optimizer.defaults == adam.defaults
    train(model, optimizer, [batch(tag, rank, 0)])
    scheduler.step()
    optimizer.add_param_group({"params": [extra], "lr": 0.5})
    optimizer.zero_grad()
    (loss_of(model, batch(tag, rank, 1)) + (extra * (rank + 1)).sum()).backward()
    optimizer.step()
    scheduler.step()
    saved = optimizer.state_dict()
    identical = same_on_every_rank(torch.cat([flat_parameters(model), extra.detach()]))

    assert identical
    assert [g["lr"] for g in optimizer.param_groups] == [0.005, 0.25]
    assert optimizer.param_groups[0]["betas"] == (0.8, 0.99)
    # Adam's first step moves each coordinate by lr * sign(grad)
    torch.testing.assert_close(extra.detach(), torch.full((2,), 0.5, dtype=torch.float64),
                               rtol=1e-6, atol=1e-6)
    assert len(saved["state"]) == len(list(model.parameters())) + 1
    fresh = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters()),
                                     named_parameters=model.named_parameters())
    fresh.add_param_group({"params": [extra]})
    fresh.load_state_dict(saved)
    assert fresh.param_groups[0]["lr"] == 0.005
    torch.testing.assert_close(fresh.state[extra]["exp_avg"], optimizer.state[extra]["exp_avg"])


def test_synchronize_then_skip_synchronize(rank, size):
    tag = "torch.opt.sync"
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    loss_of(model, batch(tag, rank, 0)).backward()
    optimizer.synchronize()
    grads = [p.grad.clone() for p in model.parameters()]
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
    with optimizer.skip_synchronize():
        optimizer.step()
    after_first = flat_parameters(model)
    optimizer.zero_grad()
    loss_of(model, batch(tag, rank, 1)).backward()
    optimizer.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()  # warns, does not reduce a second time
    identical = same_on_every_rank(flat_parameters(model))

    reference = make_model()
    loss_of(reference, global_batch(tag, size, 0)).backward()
    assert identical
    for grad, p in zip(grads, reference.parameters()):
        torch.testing.assert_close(grad, p.grad, rtol=1e-9, atol=1e-12)
    assert any("skip_synchronize" in str(w.message) for w in caught)
    assert not torch.equal(after_first, flat_parameters(model))


@pytest.mark.parametrize("as_dense", [False, True], ids=["sparse", "sparse_as_dense"])
def test_sparse_gradients(as_dense, rank, size):
    torch.manual_seed(5)
    embedding = torch.nn.Embedding(10, 3, sparse=True).double()
    start = embedding.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=1.0),
                                         named_parameters=embedding.named_parameters(),
                                         sparse_as_dense=as_dense)
    indices = torch.tensor([rank % 10, (rank + 3) % 10, 7])
    embedding(indices).sum().backward()
    optimizer.step()
    identical = same_on_every_rank(embedding.weight.detach().reshape(-1))

    expected = start.clone()
    for r in range(size):
        for i in (r % 10, (r + 3) % 10, 7):
            expected[i] -= 1.0 / size
    assert identical
    torch.testing.assert_close(embedding.weight.detach(), expected)


def test_one_rank_is_the_wrapped_optimizer(rank, size):
    """As Horovod: a job of one rank hooks nothing, so the optimizer behaves
    as the one it wraps (a `python train.py` debugging run)."""
    if size > 1:
        pytest.skip("one rank only")
    model = TwoBranches()
    embedding = torch.nn.Embedding(5, 2, sparse=True).double()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": model.parameters()},
         {"params": embedding.parameters(), "weight_decay": 0.0}], lr=0.1, weight_decay=0.5))
    x = float_input("torch.opt.one", rank, (4, 3))
    for _ in range(2):  # two passes before a step accumulate, as without hora
        (model(x, use_b=False).sum() + embedding(torch.tensor([1])).sum()).backward()
    sparse = embedding.weight.grad
    assert model.never.weight.grad is None and model.b.weight.grad is None
    never_before = model.never.weight.detach().clone()
    optimizer.step()
    assert embedding.weight.grad is sparse  # handed to the optimizer as it was
    # weight decay did not move a parameter that has no gradient
    assert torch.equal(model.never.weight, never_before)
    model(x, use_b=True).sum().backward()
    optimizer.zero_grad()  # between backward and step: allowed
    optimizer.step()


def test_groups_leave_out_tensors_the_optimizer_does_not_train(rank, size):
    model = make_model()
    model[2].bias.requires_grad_(False)
    other = torch.zeros(3, requires_grad=True)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1),
        named_parameters=[(n, p) for n, p in model.named_parameters() if p.requires_grad],
        groups=[list(model.parameters()) + [other]])
    x, y = batch("torch.opt.frozen", rank, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    assert same_on_every_rank(flat_parameters(model))


def test_load_state_dict_forgets_the_step_in_flight(rank, size):
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         backward_passes_per_step=2)
    saved = optimizer.state_dict()
    x, y = batch("torch.opt.reload", rank, 0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.load_state_dict(saved)  # a bad step: back to the checkpoint
    optimizer.zero_grad()
    for _ in range(2):
        torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    assert same_on_every_rank(flat_parameters(model))
    assert (optimizer.op, optimizer.gradient_predivide_factor, optimizer.sparse_as_dense) == \
        (hvd.Average, 1.0, False)


def test_parameter_name_errors_in_horovods_words():
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match="Parameter names in named_parameters must be unique. "
                                         "Found duplicates: 0.weight"):
        hvd.DistributedOptimizer(sgd, named_parameters=named + [("0.weight", named[0][1])])
    with pytest.raises(ValueError, match="named_parameters should be a sequence of tuples"):
        hvd.DistributedOptimizer(sgd, named_parameters=[p for _, p in named])
