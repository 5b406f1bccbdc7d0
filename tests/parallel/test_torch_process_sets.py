"""hora.torch inside process sets, as Horovod's ``process_set=``: every
collective (sync, async, in place, grouped, sparse, differentiable with its
backward in the set) against references computed from the set members'
inputs, the broadcast helpers, DistributedOptimizer reducing within a set
(and local steps outside it), SyncBatchNorm over a set's batches, two sets
using the same names at the same time, and the errors.

The ranks are split into evens and odds; each rank works in the set it
belongs to, so both sets run side by side. On one rank the evens are the
global set itself (a set with the global set's ranks cannot be added)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hora  # noqa: E402
import hora.torch as hvd  # noqa: E402
from torch_helpers import float_input, to_numpy, torch_input  # noqa: E402
from parity_sets import other_set, parity_fixture  # noqa: E402


sets = pytest.fixture(parity_fixture, name="sets")


def member_inputs(tag, ranks, shape, dtype):
    return {r: torch_input(tag, r, shape, dtype) for r in ranks}


def test_the_torch_face_exports_the_process_set_api():
    assert hvd.ProcessSet is hora.ProcessSet
    assert hvd.global_process_set is hora.global_process_set
    assert hvd.add_process_set is hora.add_process_set
    assert hvd.remove_process_set is hora.remove_process_set
    for name in ("ProcessSet", "global_process_set", "add_process_set", "remove_process_set"):
        assert name in hvd.__all__
    import hora.torch.mpi_ops as mpi_ops
    assert mpi_ops.global_process_set is hora.global_process_set


@pytest.mark.parametrize("dtype", ["float32", "int32", "float64", "bfloat16"])
def test_allreduce_sum_and_average_in_sets(rank, size, sets, dtype):
    _, _, mine = sets
    inputs = member_inputs("tps.allreduce", mine.ranks or range(size), (5, 3), dtype)
    total = sum(to_numpy(t).astype(np.float64) for t in inputs.values())
    x = inputs[rank]
    # both sets use the same name at the same time; so does the global set after
    got = hvd.allreduce(x, name=f"tps.same.{dtype}", op=hvd.Sum, process_set=mine)
    np.testing.assert_array_equal(to_numpy(got).astype(np.float64), total)
    if dtype != "int32":
        avg = hvd.allreduce(x, name=f"tps.avg.{dtype}", process_set=mine)
        np.testing.assert_allclose(to_numpy(avg).astype(np.float64), total / len(inputs),
                                   rtol=1e-2 if dtype == "bfloat16" else 1e-6)
    everyone = sum(to_numpy(torch_input("tps.allreduce", r, (5, 3), dtype)).astype(np.float64)
                   for r in range(size))
    got = hvd.allreduce(x, name=f"tps.same.{dtype}", op=hvd.Sum)
    np.testing.assert_array_equal(to_numpy(got).astype(np.float64), everyone)


def test_async_in_place_and_scaled_allreduce(rank, sets):
    _, _, mine = sets
    n = mine.size()
    handle = hvd.allreduce_async(torch.full((4,), float(rank)), op=hvd.Sum, process_set=mine)
    pointer = torch.full((6,), float(rank + 1))  # contiguous CPU: handed over by pointer
    same = hvd.synchronize(hvd.allreduce_async_(pointer, op=hvd.Max, process_set=mine))
    strided = torch.arange(12, dtype=torch.float64).reshape(3, 4)[:, 1] + rank  # copied back
    hvd.allreduce_(strided, op=hvd.Sum, process_set=mine)
    scaled = hvd.allreduce(torch.full((3,), float(rank)), prescale_factor=2.0,
                           postscale_factor=0.5, process_set=mine)  # Average: / set size
    assert same is pointer
    np.testing.assert_array_equal(hvd.synchronize(handle).numpy(), [float(sum(mine.ranks))] * 4)
    np.testing.assert_array_equal(pointer.numpy(), [float(max(mine.ranks) + 1)] * 6)
    want = sum(np.arange(12, dtype=np.float64).reshape(3, 4)[:, 1] + r for r in mine.ranks)
    np.testing.assert_array_equal(strided.numpy(), want)
    np.testing.assert_allclose(scaled.numpy(), [sum(mine.ranks) / n] * 3)
    integers = hvd.allreduce(torch.tensor([7 * rank + 3]), op=hvd.Average, process_set=mine)
    assert integers.item() == int(sum(7 * r + 3 for r in mine.ranks) / n)


def test_grouped_allreduce_forms(rank, sets):
    _, _, mine = sets
    n = mine.size()

    def group():
        return [torch.full((k + 2,), float(rank + k)) for k in range(3)]

    def want(k, op=hvd.Sum):
        total = float(sum(r + k for r in mine.ranks))
        return [total / n if op == hvd.Average else total] * (k + 2)

    handle = hvd.grouped_allreduce_async(group(), op=hvd.Sum, process_set=mine)
    in_place = group()
    in_place_handle = hvd.grouped_allreduce_async_(in_place, process_set=mine)
    plain = hvd.grouped_allreduce(group(), op=hvd.Sum, name="tps.grouped", process_set=mine)
    direct = group()
    hvd.grouped_allreduce_(direct, op=hvd.Sum, process_set=mine)
    for k, got in enumerate(hvd.synchronize(handle)):
        np.testing.assert_array_equal(got.numpy(), want(k))
    assert hvd.synchronize(in_place_handle) is not None
    for k in range(3):
        np.testing.assert_allclose(in_place[k].numpy(), want(k, hvd.Average))
        np.testing.assert_array_equal(plain[k].numpy(), want(k))
        np.testing.assert_array_equal(direct[k].numpy(), want(k))


@pytest.mark.parametrize("op", ["Sum", "Average"])
def test_allreduce_backward_stays_in_the_set(rank, sets, op):
    _, _, mine = sets
    op = getattr(hvd, op)
    x = float_input("tps.ar.x", rank, (4,)).requires_grad_(True)
    y = hvd.allreduce(x, op=op, process_set=mine)
    (y * float_input("tps.ar.w", rank, (4,))).sum().backward()
    weights = sum(float_input("tps.ar.w", r, (4,)) for r in mine.ranks)
    want = weights / mine.size() if op == hvd.Average else weights
    torch.testing.assert_close(x.grad, want)
    xs = [float_input(f"tps.gar.x{k}", rank, (3,)).requires_grad_(True) for k in range(2)]
    ys = hvd.grouped_allreduce(xs, op=op, process_set=mine)
    sum(y.sum() * (k + 1) for k, y in enumerate(ys)).backward()
    for k, x in enumerate(xs):
        scale = 1.0 if op == hvd.Average else float(mine.size())
        torch.testing.assert_close(x.grad, torch.full((3,), (k + 1) * scale, dtype=torch.float64))


def test_allgather_and_its_backward(rank, sets):
    _, _, mine = sets
    me = mine.rank()
    rows = {r: k + 1 for k, r in enumerate(mine.ranks)}  # a different row count per member
    x = float_input("tps.ag.x", rank, (rows[rank], 2)).requires_grad_(True)
    gathered = hvd.allgather(x, process_set=mine)
    want = torch.cat([float_input("tps.ag.x", r, (rows[r], 2)) for r in mine.ranks])
    torch.testing.assert_close(gathered.detach(), want)
    total_rows = sum(rows.values())
    (gathered * float_input("tps.ag.w", rank, (total_rows, 2))).sum().backward()
    average = sum(float_input("tps.ag.w", r, (total_rows, 2)) for r in mine.ranks) / len(rows)
    start = sum(rows[r] for r in mine.ranks[:me])
    torch.testing.assert_close(x.grad, average[start:start + rows[rank]])

    ints = torch.full((rows[rank], 3), rank, dtype=torch.int64)
    async_result = hvd.synchronize(hvd.allgather_async(ints, process_set=mine))
    grouped = hvd.grouped_allgather([ints, ints.double()], process_set=mine)
    grouped_async = hvd.synchronize(hvd.grouped_allgather_async([ints], process_set=mine))
    want = torch.cat([torch.full((rows[r], 3), r, dtype=torch.int64) for r in mine.ranks])
    for got in (async_result, grouped[0], grouped[1].long(), grouped_async[0]):
        assert torch.equal(got, want)


def test_broadcast_from_a_global_root_in_the_set(rank, sets):
    _, _, mine = sets
    root = mine.ranks[-1]  # a global rank
    value = torch.full((3,), float(rank))
    assert torch.equal(hvd.broadcast(value, root, process_set=mine), torch.full((3,), root * 1.0))
    handle = hvd.broadcast_async(value, root_rank=root, process_set=mine)
    in_place = torch.full((2, 2), rank, dtype=torch.int32)
    hvd.broadcast_(in_place, root, name="tps.bcast.inplace", process_set=mine)
    in_place_async = torch.full((5,), float(rank))
    hvd.synchronize(hvd.broadcast_async_(in_place_async, root, process_set=mine))
    assert torch.equal(hvd.synchronize(handle), torch.full((3,), root * 1.0))
    assert torch.equal(in_place, torch.full((2, 2), root, dtype=torch.int32))
    assert torch.equal(in_place_async, torch.full((5,), root * 1.0))
    # gradient: the set's average of the incoming gradients on the root, zero elsewhere
    x = float_input("tps.bc.x", rank, (4,)).requires_grad_(True)
    y = hvd.broadcast(x, root, name="tps.bc.grad", process_set=mine)
    torch.testing.assert_close(y.detach(), float_input("tps.bc.x", root, (4,)))
    (y * float_input("tps.bc.w", rank, (4,))).sum().backward()
    average = sum(float_input("tps.bc.w", r, (4,)) for r in mine.ranks) / mine.size()
    torch.testing.assert_close(x.grad, average if rank == root else torch.zeros_like(average))


def test_a_root_outside_the_set_is_refused(rank, size, sets):
    outsider = other_set(sets).ranks[0]
    _, _, mine = sets
    with pytest.raises(ValueError, match=f"root rank {outsider} is not in process set"):
        hvd.broadcast(torch.zeros(2), root_rank=outsider, name="tps.bad.root", process_set=mine)


def test_alltoall_in_the_set(rank, sets):
    _, _, mine = sets
    n, me = mine.size(), mine.rank()
    splits = [k + 1 for k in range(n)]  # one entry per member
    send = torch.cat([torch.full((k + 1, 2), 100.0 * rank + k) for k in range(n)])
    send.requires_grad_(True)
    output, received = hvd.alltoall(send, splits=splits, process_set=mine)
    want = torch.cat([torch.full((me + 1, 2), 100.0 * r + me) for r in mine.ranks])
    assert torch.equal(output.detach(), want)
    assert received.tolist() == [me + 1] * n
    (output * (rank + 1)).sum().backward()  # the reverse alltoall brings the gradients back
    back = torch.cat([torch.full((k + 1, 2), float(r + 1)) for k, r in enumerate(mine.ranks)])
    assert torch.equal(send.grad, back)
    even = torch.arange(2 * n, dtype=torch.int64).reshape(2 * n, 1) + 1000 * rank
    plain = hvd.alltoall(even, process_set=mine)  # no splits: output only, divided evenly
    got, got_splits = hvd.synchronize(hvd.alltoall_async(even, process_set=mine))
    want = torch.cat([torch.arange(2 * me, 2 * me + 2).reshape(2, 1) + 1000 * r
                      for r in mine.ranks])
    assert torch.equal(plain, want) and torch.equal(got, want)
    assert got_splits.tolist() == [2] * n


def test_reducescatter_in_the_set(rank, sets):
    _, _, mine = sets
    n, me = mine.size(), mine.rank()
    count = 2 * n + 1  # uneven: the first members get one row more
    inputs = {r: float_input("tps.rs", r, (count, 3)) for r in mine.ranks}
    total = sum(inputs.values())
    counts = [count // n + (1 if k < count % n else 0) for k in range(n)]
    start = sum(counts[:me])
    block = slice(start, start + counts[me])
    x = inputs[rank].clone().requires_grad_(True)
    got = hvd.reducescatter(x, op=hvd.Sum, process_set=mine)
    torch.testing.assert_close(got.detach(), total[block])
    got.sum().backward()  # Horovod's gradient: allgather of the gradients, times size for Sum
    torch.testing.assert_close(x.grad, torch.full((count, 3), float(n), dtype=torch.float64))
    avg = hvd.synchronize(hvd.reducescatter_async(inputs[rank], process_set=mine))
    torch.testing.assert_close(avg, total[block] / n)
    grouped = hvd.grouped_reducescatter([inputs[rank], inputs[rank] * 2], op=hvd.Sum,
                                        process_set=mine)
    grouped_async = hvd.synchronize(hvd.grouped_reducescatter_async([inputs[rank]], op=hvd.Sum,
                                                                    process_set=mine))
    torch.testing.assert_close(grouped[0], total[block])
    torch.testing.assert_close(grouped[1], 2 * total[block])
    torch.testing.assert_close(grouped_async[0], total[block])


def test_sparse_allreduce_in_the_set(rank, sets):
    _, _, mine = sets
    indices = torch.tensor([[rank % 4, (rank + 1) % 4]])
    values = torch.tensor([[1.0 + rank, 2.0], [3.0, 4.0 * rank]])
    sparse = torch.sparse_coo_tensor(indices, values, (4, 2), check_invariants=True)
    want = sum(torch.sparse_coo_tensor(torch.tensor([[r % 4, (r + 1) % 4]]),
                                       torch.tensor([[1.0 + r, 2.0], [3.0, 4.0 * r]]),
                                       (4, 2), check_invariants=True).to_dense()
               for r in mine.ranks)
    handle = hvd.sparse_allreduce_async(sparse, name="tps.sparse", op=hvd.Average,
                                        process_set=mine)
    torch.testing.assert_close(handle().to_dense(), want / mine.size())
    summed = hvd.synchronize(hvd.sparse_allreduce_async(sparse, op=hvd.Sum, process_set=mine))
    torch.testing.assert_close(summed.to_dense(), want)


def test_barrier_and_objects(rank, sets):
    _, _, mine = sets
    hvd.barrier(process_set=mine)
    assert hvd.allgather_object({"r": rank}, process_set=mine) == [{"r": r} for r in mine.ranks]
    root = mine.ranks[-1]
    assert hvd.broadcast_object(("from", rank), root_rank=root, process_set=mine) == ("from", root)
    # unnamed calls count per set: the sets make different numbers of them,
    # and the global set's next unnamed call still matches on every rank
    for _ in range(len(mine.ranks) + 2 * (rank % 2)):
        hvd.allreduce(torch.ones(1), process_set=mine)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == hvd.size()


def test_broadcast_parameters_and_optimizer_state(rank, sets):
    _, _, mine = sets
    root = mine.ranks[-1]

    def build(seed):
        torch.manual_seed(seed)
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01 * (seed + 1))
        return model, optimizer

    model, optimizer = build(rank)
    if rank == root:  # only the root has optimizer state
        model(float_input("tps.bos", rank, (4, 3), torch.float32)).sum().backward()
        optimizer.step()
    hvd.broadcast_parameters(model.state_dict(), root_rank=root, process_set=mine)
    hvd.broadcast_optimizer_state(optimizer, root_rank=root, process_set=mine)

    reference, reference_optimizer = build(root)
    reference(float_input("tps.bos", root, (4, 3), torch.float32)).sum().backward()
    reference_optimizer.step()
    for got, want in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(got.detach(), want.detach())
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 * (root + 1))
    for p, q in zip(model.parameters(), reference.parameters()):
        state, want = optimizer.state[p], reference_optimizer.state[q]
        assert set(state) == set(want)
        for key in want:
            torch.testing.assert_close(torch.as_tensor(state[key]), torch.as_tensor(want[key]))
    named = [(f"p{i}", torch.full((2,), float(rank))) for i in range(2)]
    hvd.broadcast_parameters(named, root, process_set=mine)
    assert all(torch.equal(t, torch.full((2,), float(root))) for _, t in named)


def make_model():
    torch.manual_seed(1234)  # the same start on every rank
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(),
                               torch.nn.Linear(3, 1)).double()


def batch(tag, rank, step, part):
    return (float_input(f"{tag}.x.{step}.{part}", rank, (6, 4)),
            float_input(f"{tag}.y.{step}.{part}", rank, (6, 1)))


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


OPTIMIZER_CASES = {
    "plain": {},
    "grouped": {"groups": 2},
    "two_passes": {"backward_passes_per_step": 2},
    "fp16": {"compression": hvd.Compression.fp16},
    "predivide": {"gradient_predivide_factor": 2.0},
    "sum": {"op": hvd.Sum},
}


def train(model, optimizer, tag, ranks_of_data, passes, steps=3, divide=True):
    """SGD steps on the mean over ``ranks_of_data`` of their losses (the
    reference of a set's reduction), or on this rank's loss when it is the
    optimizer that reduces."""
    for step in range(steps):
        optimizer.zero_grad()
        for part in range(passes):
            losses = [loss_of(model, *batch(tag, r, step, part)) for r in ranks_of_data]
            loss = sum(losses) / (len(losses) if divide else 1)
            loss.backward()
        optimizer.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.parametrize("case", list(OPTIMIZER_CASES))
def test_distributed_optimizer_in_a_set(rank, size, sets, case):
    evens, odds, mine = sets
    options = dict(OPTIMIZER_CASES[case])
    passes = options.get("backward_passes_per_step", 1)
    tag = f"tps.opt.{case}"
    model = make_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    optimizer = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                         process_set=mine, **options)
    assert optimizer.process_set is mine
    train(model, optimizer, tag, [rank], passes)

    reference = make_model()
    reference_sgd = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
    summed = options.get("op") == hvd.Sum
    train(reference, reference_sgd, tag, mine.ranks, passes, divide=not summed)
    tolerance = {"atol": 2e-3, "rtol": 2e-3} if case == "fp16" else {}
    torch.testing.assert_close(flat(model), flat(reference), **tolerance)

    # replicas in a set end identical; the sets differ from each other
    everyone = hvd.allgather_object(flat(model))
    for r, params in enumerate(everyone):
        if r in mine.ranks:
            assert torch.equal(params, flat(model))
        else:
            assert not torch.allclose(params, flat(model))


def test_distributed_optimizer_outside_its_set_steps_locally(rank, size, sets):
    """Every rank wraps its optimizer with the evens: the odds reduce
    nothing and apply their own gradients, as in Horovod."""
    evens, _, _ = sets
    model = make_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.2),
                                         named_parameters=model.named_parameters(),
                                         process_set=evens)
    train(model, optimizer, "tps.outside", [rank], 1)
    reference = make_model()
    members = evens.ranks if rank in evens.ranks else [rank]
    train(reference, torch.optim.SGD(reference.parameters(), lr=0.2), "tps.outside", members, 1)
    torch.testing.assert_close(flat(model), flat(reference))


def test_distributed_optimizer_with_sparse_gradients_in_a_set(rank, sets):
    _, _, mine = sets

    def build():
        torch.manual_seed(5)
        return torch.nn.Embedding(6, 3, sparse=True).double()

    def loss(embedding, r, step):
        lookups = torch.tensor([(r + step) % 6, (2 * r + 1) % 6, 5])
        return (embedding(lookups) * float_input(f"tps.sparse.w.{step}", r, (3, 3))).sum()

    embedding = build()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(embedding.parameters(), lr=0.5),
                                         named_parameters=embedding.named_parameters(),
                                         process_set=mine)
    reference = build()
    reference_sgd = torch.optim.SGD(reference.parameters(), lr=0.5)
    for step in range(2):
        optimizer.zero_grad()
        loss(embedding, rank, step).backward()
        optimizer.step()
        reference_sgd.zero_grad()
        (sum(loss(reference, r, step) for r in mine.ranks) / mine.size()).backward()
        reference_sgd.step()
    torch.testing.assert_close(embedding.weight.detach(), reference.weight.detach())


def test_sync_batch_norm_in_a_set(rank, sets):
    _, _, mine = sets
    channels = 3

    def rows_of(r):
        return r + 2

    def local(r, step):
        shape = (rows_of(r), channels)
        return (float_input(f"tps.sbn.x.{step}", r, shape) * 2 + 0.5,
                float_input(f"tps.sbn.w.{step}", r, shape))

    sync = hvd.SyncBatchNorm(channels, process_set=mine).double()
    reference = torch.nn.BatchNorm1d(channels).double()
    with torch.no_grad():
        for module in (sync, reference):
            module.weight.copy_(torch.linspace(0.5, 1.5, channels))
            module.bias.copy_(torch.linspace(-1.0, 1.0, channels))
    start = sum(rows_of(r) for r in mine.ranks[:mine.rank()])
    rows = slice(start, start + rows_of(rank))
    for step in range(2):
        x, w = local(rank, step)
        x.requires_grad_(True)
        y = sync(x)
        (y * w).sum().backward()
        parts = [local(r, step) for r in mine.ranks]
        xs = torch.cat([p[0] for p in parts]).requires_grad_(True)
        ys = reference(xs)
        (ys * torch.cat([p[1] for p in parts])).sum().backward()
        torch.testing.assert_close(y.detach(), ys.detach()[rows])
        torch.testing.assert_close(x.grad, xs.grad[rows])
    torch.testing.assert_close(sync.running_mean, reference.running_mean)
    torch.testing.assert_close(sync.running_var, reference.running_var)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(torch.nn.Sequential(
        torch.nn.BatchNorm1d(channels)), process_set=mine)
    assert converted[0].process_set is mine


def test_a_rank_outside_the_set_is_refused(rank, sets):
    other = other_set(sets)
    ranks = ", ".join(map(str, other.ranks))
    message = rf"rank {rank}\) is not in process set {other.process_set_id} \(ranks? {ranks}\)"
    calls = [
        lambda: hvd.allreduce(torch.zeros(2), name="tps.outsider", process_set=other),
        lambda: hvd.allreduce_(torch.zeros(2), name="tps.outsider.ptr", process_set=other),
        lambda: hvd.grouped_allreduce([torch.zeros(2)], process_set=other),
        lambda: hvd.allgather(torch.zeros(1, 2), process_set=other),
        lambda: hvd.broadcast_(torch.zeros(2), other.ranks[0], process_set=other),
        lambda: hvd.alltoall(torch.zeros(len(other.ranks)), process_set=other),
        lambda: hvd.reducescatter(torch.zeros(len(other.ranks)), process_set=other),
        lambda: hvd.barrier(process_set=other),
        lambda: hvd.broadcast_object(1, other.ranks[0], process_set=other),
        lambda: hvd.SyncBatchNorm(2, process_set=other)(torch.zeros(3, 2)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match=message):
            call()
    # the job is still fine
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="tps.after.outsider").item() == \
        hvd.size()


def test_unregistered_sets_and_other_objects_are_refused(rank, size):
    unregistered = hvd.ProcessSet([0])
    # The same classes and words as every adapter (hora.common._adapter.checks).
    with pytest.raises(hvd.HoraInvalidArgumentError, match="is not registered"):
        hvd.allreduce(torch.ones(1), process_set=unregistered)
    with pytest.raises(hvd.HoraTypeError, match="must be one of hora's process sets"):
        hvd.allreduce(torch.ones(1), process_set="evens")
    with pytest.raises(hvd.HoraTypeError, match="dtype torch.complex64 is not supported"):
        hvd.allreduce(torch.ones(1, dtype=torch.complex64), name="tps.complex")
    with pytest.raises(ValueError, match="is not registered"):
        hvd.DistributedOptimizer(torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
                                 process_set=unregistered)
    for call in (lambda: hvd.allreduce_async_(torch.ones(1), process_set=object()),
                 lambda: hvd.SyncBatchNorm(2, process_set="evens")):
        with pytest.raises(TypeError, match="process set"):
            call()
    # a removed set is refused again
    ps = hvd.add_process_set([0]) if size > 1 else None
    if ps is not None:
        hvd.remove_process_set(ps)
        with pytest.raises(ValueError, match="is not registered"):
            hvd.broadcast_parameters([torch.zeros(1)], 0, process_set=ps)


def test_two_sets_use_the_same_names_at_once(rank, size, sets):
    """Both sets keep many same-named collectives in flight while the global
    set runs one of the same name; each finishes in its own set."""
    _, _, mine = sets
    if mine is hvd.global_process_set:
        pytest.skip("on one rank this rank's set is the global set itself")
    handles = []
    for step in range(20):
        x = torch.full((513,), float(rank * 1000 + step))
        handles.append(hvd.allreduce_async_(x, name=f"tps.shared.{step}", op=hvd.Sum,
                                            process_set=mine))
    everyone = hvd.allreduce(torch.ones(1 << 16), name="tps.shared.0", op=hvd.Sum)
    for step, handle in enumerate(handles):
        got = hvd.synchronize(handle)
        want = float(sum(r * 1000 + step for r in mine.ranks))
        assert got[0].item() == want and got[-1].item() == want
    assert everyone[0].item() == size
