"""Behaviour that Horovod defines and hora.torch matches by default: the
gradient layout handed to sparse optimizers, optimizer-state broadcast with
missing gradients or state, parameter names, the callable sparse handle,
integer scaling, uint16, Horovod's warning text and exception classes."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402


def test_parameter_names_without_named_parameters(rank, size):
    first, second = torch.nn.Linear(2, 3), torch.nn.Linear(3, 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(
        [{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.5}], lr=0.1))
    names = optimizer._parameter_names
    expected = {first.weight: "allreduce.noname.0.0", first.bias: "allreduce.noname.0.1",
                second.weight: "allreduce.noname.1.0", second.bias: "allreduce.noname.1.1"}
    assert names == expected
    assert hvd.allgather_object(sorted(names.values())) == [sorted(expected.values())] * size
    named = hvd.DistributedOptimizer(torch.optim.SGD(first.parameters(), lr=0.1),
                                     named_parameters=first.named_parameters())
    assert named._parameter_names == {first.weight: "weight", first.bias: "bias"}


def test_sparse_as_dense_hands_sparse_adam_a_sparse_gradient(rank, size):
    torch.manual_seed(3)
    embedding = torch.nn.Embedding(8, 2, sparse=True).double()
    start = embedding.weight.detach().clone()
    optimizer = hvd.DistributedOptimizer(torch.optim.SparseAdam(embedding.parameters(), lr=0.1),
                                         named_parameters=embedding.named_parameters(),
                                         sparse_as_dense=True)
    rows = torch.tensor([rank % 8, 5])
    embedding(rows).sum().backward()
    optimizer.step()  # SparseAdam raises on a dense gradient
    assert embedding.weight.grad.is_sparse
    # the averaged gradient: 1/size per use of a row on each rank
    dense = embedding.weight.grad.to_dense()
    expected = torch.zeros(8, 2, dtype=torch.float64)
    for r in range(size):
        expected[r % 8] += 1.0 / size
        expected[5] += 1.0 / size
    torch.testing.assert_close(dense, expected)
    moved = (embedding.weight.detach() != start).any(dim=1)
    assert moved.tolist() == (expected != 0).any(dim=1).tolist()


def test_sparse_allreduce_async_handle_is_called_for_the_result(rank, size):
    t = torch.sparse_coo_tensor(torch.tensor([[rank % 4]]), torch.tensor([2.0]), (4,))
    handle = hvd.sparse_allreduce_async(t, name="torch.semantics.sparse", op=hvd.Sum)
    result = handle()
    expected = torch.zeros(4)
    for r in range(size):
        expected[r % 4] += 2.0
    torch.testing.assert_close(result.to_dense(), expected)
    average = hvd.sparse_allreduce_async(t, name="torch.semantics.sparse.avg", op=hvd.Average)
    torch.testing.assert_close(hvd.synchronize(average).to_dense(), expected / size)


def two_layer_model():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))


def test_broadcast_optimizer_state_with_missing_gradients_and_state(rank, size):
    model = two_layer_model()
    unused = torch.nn.Linear(2, 2)  # never gets a gradient or state
    optimizer = torch.optim.Adam(list(model.parameters()) + list(unused.parameters()), lr=0.01)
    if rank == 0:
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    moments = [optimizer.state[p]["exp_avg"].clone() for p in model.parameters()]
    gathered = hvd.allgather_object([m.tolist() for m in moments])
    assert all(g == gathered[0] for g in gathered)
    assert not optimizer.state.get(unused.weight)


@pytest.mark.parametrize("root_has_state", [False, True])
def test_broadcast_optimizer_state_leaves_zero_gradients_as_horovod(rank, size, root_has_state):
    # Horovod creates missing state by a step with zero gradients and leaves
    # them there: every rank that had no state ends with a zero .grad on each
    # parameter that requires grad; a frozen one keeps none, and a rank that
    # had state keeps its own gradients.
    model = two_layer_model()
    model[1].bias.requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
    before = [p.detach().clone() for p in model.parameters()]
    stepped = rank == 0 and root_has_state
    if stepped:
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        before = [p.detach().clone() for p in model.parameters()]
        own = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    for p, start in zip(model.parameters(), before):
        torch.testing.assert_close(p.detach(), start)  # parameters untouched
    if stepped:
        for p, grad in zip(model.parameters(), own):
            assert (p.grad is None) == (grad is None)
            if grad is not None:
                torch.testing.assert_close(p.grad, grad)
        return
    assert model[1].bias.grad is None
    for p in [model[0].weight, model[0].bias, model[1].weight]:
        assert p.grad is not None and not p.grad.is_sparse and not p.grad.any()


def test_broadcast_optimizer_state_creates_sparse_state(rank, size):
    torch.manual_seed(2)
    embedding = torch.nn.Embedding(6, 2, sparse=True)
    optimizer = torch.optim.SparseAdam(embedding.parameters(), lr=0.1)
    if rank == 0:
        embedding(torch.tensor([1, 4])).sum().backward()
        optimizer.step()
    hvd.broadcast_optimizer_state(optimizer, 0, model=embedding)
    state = optimizer.state[embedding.weight]
    gathered = hvd.allgather_object(state["exp_avg"].tolist())
    assert all(g == gathered[0] for g in gathered)


def test_broadcast_optimizer_state_failure_is_raised_on_every_rank(rank, size):
    class Fussy(torch.optim.SGD):
        def step(self, closure=None):
            if rank != 0:
                raise RuntimeError("cannot build state here")
            return super().step(closure)

    model = two_layer_model()
    optimizer = Fussy(model.parameters(), lr=0.1, momentum=0.9)
    if rank == 0:
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
    if size == 1:
        hvd.broadcast_optimizer_state(optimizer, 0)
        return
    with pytest.raises(RuntimeError, match="rank 1: RuntimeError: cannot build state here"):
        hvd.broadcast_optimizer_state(optimizer, 0)


def test_integer_scaling_on_torch_tensors(rank, size):
    x = torch.tensor([3, -3, 10], dtype=torch.int64) * (rank + 1)
    got = hvd.allreduce(x, op=hvd.Average, prescale_factor=0.5, postscale_factor=3.0,
                        name="torch.semantics.int_scale")
    summed = sum(np.trunc(np.array([3, -3, 10]) * (r + 1) * 0.5) for r in range(size))
    assert got.tolist() == np.trunc(summed * 3.0 / size).astype(np.int64).tolist()


def test_uint16_collectives(rank, size):
    x = torch.tensor([rank, 60000, 7], dtype=torch.uint16)
    assert hvd.allgather(x, name="torch.semantics.u16.gather").shape == (3 * size,)
    assert hvd.broadcast(x, 0, name="torch.semantics.u16.bcast").tolist()[0] == 0
    maximum = hvd.allreduce(x, op=hvd.Max, name="torch.semantics.u16.max")
    assert maximum.dtype == torch.uint16
    assert maximum.to(torch.int64).tolist() == [size - 1, 60000, 7]


def test_step_after_synchronize_warns_in_horovods_words(rank, size):
    model = two_layer_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        optimizer.step()
    assert any(str(w.message).startswith(
        "optimizer.step() called without optimizer.skip_synchronize() context after "
        "optimizer.synchronize(). This can cause training slowdown.") for w in caught)


def test_exception_classes_horovod_code_catches(rank, size):
    # Horovod: RuntimeError for reducescatter with an unsupported op ...
    with pytest.raises(RuntimeError, match="Adasum"):
        hvd.reducescatter(torch.ones(size, 1), op=hvd.Adasum, name="torch.semantics.rs_adasum")
    # ... and ValueError for bad splits and unsupported dtypes
    with pytest.raises(ValueError, match="splits"):
        hvd.alltoall(torch.ones(size), splits=[0.5] * size, name="torch.semantics.splits")
    with pytest.raises(ValueError, match="complex64"):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64), name="torch.semantics.complex")
    # zero_grad() while gradients are being reduced: Horovod's AssertionError
    model = two_layer_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.ones(1, 3)).sum().backward()
    if size > 1:  # (one rank reduces nothing, as in Horovod)
        with pytest.raises(AssertionError, match="zero_grad"):
            optimizer.zero_grad()
    optimizer.step()


@pytest.mark.parametrize("grouped", [False, True])
def test_the_gradient_of_an_adasum_allreduce_is_the_adasum_of_the_gradients(rank, size, grouped):
    # Horovod's backward repeats the forward op, Adasum included
    if size & (size - 1):
        pytest.skip("op=Adasum takes a power-of-two number of ranks")
    x = torch.arange(6, dtype=torch.float64).reshape(2, 3).add(rank).requires_grad_()
    w = torch.linspace(-1, 2, 6, dtype=torch.float64).reshape(2, 3) * (rank + 1)
    if grouped:
        out = hvd.grouped_allreduce([x], op=hvd.Adasum, name="semantics.adasum_grouped")[0]
    else:
        out = hvd.allreduce(x, op=hvd.Adasum, name="semantics.adasum")
    (out * w).sum().backward()
    expected = hvd.allreduce(w, op=hvd.Adasum, name="semantics.adasum_expected")
    torch.testing.assert_close(x.grad, expected)
    if size > 1:  # not the plain sum of the gradients
        assert not torch.allclose(x.grad, hvd.allreduce(w, op=hvd.Sum))
