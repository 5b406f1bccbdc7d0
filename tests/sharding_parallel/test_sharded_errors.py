"""Bad input to the sharded optimizer: clear errors on every rank, naming
what is wrong; nothing hangs."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from sharding_helpers import batch, make  # noqa: E402


def wrap(optimizer, model, **options):
    return hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                    **options)


@pytest.mark.parametrize("value", ["zero2", "", 2, True])
def test_sharding_takes_only_the_stage_names(value):
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="sharding must be None, 'optimizer_state', "
                                         "'gradients' or 'parameters'"):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, sharding=value)


@pytest.mark.parametrize("optimizer_class,why", [
    (torch.optim.LBFGS, "whole flattened parameter"),
    (torch.optim.Adafactor, "row and column statistics"),
    (torch.optim.SparseAdam, "sparse gradients"),
])
def test_optimizers_that_need_whole_tensors_are_named(optimizer_class, why):
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match=f"{optimizer_class.__name__} cannot step a shard.*{why}"):
        wrap(optimizer_class(model.parameters(), lr=0.1), model, sharding="gradients")


def test_muon_is_named():
    model = torch.nn.Linear(3, 2, bias=False)
    with pytest.raises(ValueError, match="Muon cannot step a shard: it orthogonalizes"):
        wrap(torch.optim.Muon(model.parameters(), lr=0.1), model, sharding="optimizer_state")


class Lamb(torch.optim.SGD):
    """A stand-in with LAMB's name, as other packages name theirs."""


class MySGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


def test_lamb_by_name_and_unknown_optimizers(size):
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="Lamb cannot step a shard: its trust ratio"):
        wrap(Lamb(model.parameters(), lr=0.1), model, sharding="gradients")
    with pytest.raises(ValueError, match="cannot tell whether .*MySGD updates each element"):
        wrap(MySGD(model.parameters(), lr=0.1), model, sharding="gradients")
    hvd.declare_elementwise(MySGD)
    optimizer = wrap(MySGD(model.parameters(), lr=0.1), model, sharding="gradients")
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()


def test_combinations_that_cannot_work():
    model = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="op=Adasum cannot be combined with sharding"):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, sharding="gradients",
             op=hvd.Adasum)
    with pytest.raises(ValueError, match="groups/num_groups cannot be combined with sharding"):
        wrap(torch.optim.SGD(model.parameters(), lr=0.1), model, sharding="gradients", groups=2)


def test_parameters_that_differ_between_ranks_are_named_on_every_rank(rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    width = 6 if rank == 0 else 7
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))
    with pytest.raises(hvd.HoraMismatchError) as caught:
        wrap(torch.optim.Adam(model.parameters()), model, sharding="gradients")
    message = str(caught.value)
    assert "parameter 0 is '0.weight' float32 [6, 4] on rank 0" in message
    assert "'0.weight' float32 [7, 4] on rank" in message
    # the job goes on
    hvd.barrier()


@pytest.mark.parametrize("sharding", ["optimizer_state", "gradients", "parameters"])
def test_calls_in_the_wrong_order(sharding, rank):
    model, optimizer = make(sharding=sharding)
    x, y = batch(0, rank)
    torch.nn.functional.mse_loss(model(x), y).backward()
    with pytest.raises(RuntimeError, match="zero_grad\\(\\) was called after loss.backward"):
        optimizer.zero_grad()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step=1"):
        torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    with pytest.raises(ValueError, match="add_param_group\\(\\) is not supported"):
        optimizer.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    with pytest.raises(ValueError, match="step\\(closure\\) is not supported"):
        optimizer.step(lambda: 0.0)


def test_a_sparse_gradient_needs_sparse_as_dense(rank):
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(embedding.parameters(), lr=0.1),
        named_parameters=embedding.named_parameters(), sharding="gradients")
    with pytest.raises(ValueError, match="'weight' is sparse; .*sparse_as_dense=True"):
        embedding(torch.tensor([rank % 10])).sum().backward()
    assert optimizer._hora_stage == 2  # kept alive: its hooks hold it weakly
