"""Sharded training (ZeRO stages 1 and 2) gives the parameters replicated
training gives, keeps 1/N of the state, and works with everything the
replicated DistributedOptimizer works with."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from sharding_helpers import (  # noqa: E402
    assert_identical_on_every_rank, assert_same, batch, make, model_option, parameters, train)

STAGES = ["optimizer_state", "gradients", "parameters"]
OPTIMIZERS = [
    (torch.optim.SGD, {"momentum": 0.9, "weight_decay": 1e-3}),
    (torch.optim.Adam, {}),
    (torch.optim.AdamW, {"weight_decay": 0.1}),
    (torch.optim.RMSprop, {"momentum": 0.5}),
    (torch.optim.Adagrad, {}),
]


def exact_reduction(size):
    """At two ranks a sum has one order whatever the algorithm, so the
    sharded and replicated results are bit-identical; beyond, the
    reducescatter may add in another order than the allreduce."""
    return size <= 2


@pytest.mark.parametrize("sharding", STAGES)
@pytest.mark.parametrize("optimizer_class,options", OPTIMIZERS,
                         ids=[c.__name__ for c, _ in OPTIMIZERS])
def test_sharded_training_matches_replicated(sharding, optimizer_class, options, size):
    model, optimizer = make(optimizer_class, optimizer_options=options)
    train(model, optimizer)
    expected = parameters(model)
    model, optimizer = make(optimizer_class, sharding, optimizer_options=options)
    train(model, optimizer)
    assert_same(parameters(model), expected, exact=exact_reduction(size),
                rtol=1e-4 if optimizer_class is torch.optim.RMSprop else 1e-5)
    assert_identical_on_every_rank(model)


@pytest.mark.parametrize("sharding", STAGES)
@pytest.mark.parametrize("bucket_bytes", [0, 64, 1 << 20])
def test_any_bucket_size_gives_the_same_parameters(sharding, bucket_bytes, size):
    model, optimizer = make(bucket_bytes=bucket_bytes)
    train(model, optimizer)
    expected = parameters(model)
    model, optimizer = make(sharding=sharding, bucket_bytes=bucket_bytes)
    train(model, optimizer)
    assert_same(parameters(model), expected, exact=exact_reduction(size))


@pytest.mark.parametrize("sharding", STAGES)
def test_state_and_gradients_are_one_nth_of_replicated(sharding, size):
    model, replicated = make()
    train(model, replicated, steps=1, passes=1)
    replicated_state = state_bytes(replicated.state)
    model, optimizer = make(sharding=sharding)
    # the gradients live between backward and step
    x, y = batch(0, hvd.rank())
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.synchronize()
    full_gradients = sum(n * 4 for n in optimizer._hora_layout.numels)  # float32
    shards = sum(s.numel() * s.element_size() for s in optimizer._hora_grad_shards)
    kept = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters()
               if p.grad is not None)
    with optimizer.skip_synchronize():
        optimizer.step()
    state = state_bytes(optimizer.state)
    # every element's state lives on exactly one rank
    total_state = hvd.allreduce(torch.tensor([float(state)]), op=hvd.Sum, name="sharding.state")
    total_shards = hvd.allreduce(torch.tensor([float(shards)]), op=hvd.Sum, name="sharding.grads")
    assert float(total_state[0]) == replicated_state
    assert float(total_shards[0]) == full_gradients
    # and every rank holds 1/N of it, to within one element per bucket
    buckets = len(optimizer._hora_layout.buckets)
    assert abs(shards - full_gradients / size) <= 4 * buckets
    if sharding == "optimizer_state":
        assert kept == full_gradients
    else:
        assert kept == 0  # p.grad freed once it was in its bucket
    if sharding == "parameters":  # the weights too: 1/N of them, the rest freed
        held = sum(s.numel() * 4 for s in optimizer._hora_shards.shards)
        assert abs(held - full_gradients / size) <= 4 * buckets
        assert all(p.numel() == 0 for p in model.parameters())


def state_bytes(state):
    """Bytes of per-element state (Adam's moments; not its step counters)."""
    return sum(v.numel() * v.element_size() for entry in state.values()
               for key, v in entry.items() if isinstance(v, torch.Tensor) and key != "step")


@pytest.mark.parametrize("sharding", STAGES)
def test_backward_passes_per_step(sharding, size):
    model, optimizer = make(backward_passes_per_step=2)
    train(model, optimizer, passes=2)
    expected = parameters(model)
    model, optimizer = make(sharding=sharding, backward_passes_per_step=2)
    train(model, optimizer, passes=2)
    # stage 1 reduces the accumulated gradient once, as replicated does;
    # stage 2 reduces every pass into the shard (sums in another order)
    assert_same(parameters(model), expected,
                exact=sharding == "optimizer_state" and exact_reduction(size))


@pytest.mark.parametrize("sharding", STAGES)
@pytest.mark.parametrize("compression", ["fp16", "bf16"])
def test_compression(sharding, compression, size):
    codec = getattr(hvd.Compression, compression)
    model, optimizer = make(compression=codec)
    train(model, optimizer)
    expected = parameters(model)
    model, optimizer = make(sharding=sharding, compression=codec)
    train(model, optimizer)
    # a cast bucket rounds like the cast gradients; the reductions sum the
    # same 16-bit values in float32
    assert_same(parameters(model), expected, exact=exact_reduction(size))
    assert_identical_on_every_rank(model)


@pytest.mark.parametrize("sharding", STAGES)
def test_gradient_predivide_factor_and_sum(sharding, size):
    for options in ({"gradient_predivide_factor": 2.0}, {"op": hvd.Sum}):
        model, optimizer = make(torch.optim.SGD, **options)
        train(model, optimizer)
        expected = parameters(model)
        model, optimizer = make(torch.optim.SGD, sharding, **options)
        train(model, optimizer)
        assert_same(parameters(model), expected)


@pytest.mark.parametrize("sharding", STAGES)
def test_clip_grad_norm_across_shards(sharding, size):
    model, optimizer = make(torch.optim.SGD)
    norms = []
    for step in range(3):
        x, y = batch(step, hvd.rank())
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.synchronize()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)))
        with optimizer.skip_synchronize():
            optimizer.step()
        optimizer.zero_grad()
    expected = parameters(model)
    model, optimizer = make(torch.optim.SGD, sharding)
    got = train(model, optimizer, steps=3, clip=0.05)
    assert got == pytest.approx(norms, rel=1e-5)
    assert min(norms) > 0.05  # clipping took effect
    assert_same(parameters(model), expected)


def test_clip_grad_norm_on_the_replicated_optimizer(size):
    model, optimizer = make(torch.optim.SGD)
    norms = train(model, optimizer, steps=2, clip=0.05)
    assert all(n > 0.05 for n in norms)
    expected = parameters(model)
    model, optimizer = make(torch.optim.SGD, sharding="gradients")
    assert train(model, optimizer, steps=2, clip=0.05) == pytest.approx(norms, rel=1e-5)
    assert_same(parameters(model), expected)


# (stage 3 needs the model called as a whole: its own forward starts the
# gathers; test_parameter_sharding has ranks that skip different blocks)
@pytest.mark.parametrize("sharding", STAGES[:2])
def test_a_parameter_unused_on_one_rank(sharding, rank, size):
    """Rank 0 never uses the convolution: its gradient counts as zeros there
    and nothing waits for it."""
    def run(sharding):
        model, optimizer = make(torch.optim.SGD, sharding)
        for step in range(3):
            x, y = batch(step, rank)
            if rank == 0:
                h = torch.zeros(x.shape[0], 48)
                out = model.out(torch.tanh(model.hidden(h))) * model.gain
            else:
                out = model(x)
            torch.nn.functional.mse_loss(out, y).backward()
            optimizer.step()
            optimizer.zero_grad()
        return parameters(model)
    assert_same(run(sharding), run(None))


# (stage 3's parameters are views of flat buffers while gathered)
@pytest.mark.parametrize("sharding", STAGES[:2])
def test_parameters_that_are_not_contiguous(sharding, size):
    model, optimizer = make(channels_last=True)
    assert not model.conv.weight.is_contiguous()
    train(model, optimizer)
    expected = parameters(model)
    model, optimizer = make(sharding=sharding, channels_last=True)
    train(model, optimizer)
    assert_same(parameters(model), expected, exact=exact_reduction(size))
    assert not model.conv.weight.is_contiguous()


@pytest.mark.parametrize("sharding", STAGES)
def test_sparse_gradients_as_dense(sharding, rank, size):
    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(5)
            self.embedding = torch.nn.Embedding(10, 3, sparse=True)
            self.head = torch.nn.Linear(3, 2)

        def forward(self, index):
            return self.head(self.embedding(index))

    def run(sharding):
        model = Lookup()
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             sparse_as_dense=True, sharding=sharding,
                                             **model_option(sharding, model))
        for step in range(3):
            model(torch.tensor([(rank + step) % 10, 3])).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        return parameters(model)
    assert_same(run(sharding), run(None))


@pytest.mark.parametrize("sharding", STAGES)
def test_parameter_groups_with_their_own_options(sharding, size):
    def run(sharding):
        model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Linear(7, 3))
        torch.manual_seed(2)
        for p in model.parameters():
            torch.nn.init.normal_(p)
        decay = [p for n, p in model.named_parameters() if n.endswith("weight")]
        plain = [p for n, p in model.named_parameters() if n.endswith("bias")]
        optimizer = hvd.DistributedOptimizer(
            torch.optim.AdamW([{"params": decay, "weight_decay": 0.5},
                               {"params": plain, "weight_decay": 0.0, "lr": 0.1}], lr=0.01),
            named_parameters=model.named_parameters(), sharding=sharding, bucket_bytes=64,
            **model_option(sharding, model))
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        for step in range(3):
            x = torch.randn(4, 5, generator=torch.Generator().manual_seed(step + hvd.rank()))
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        assert optimizer.param_groups[1]["lr"] == pytest.approx(0.1 * 0.5 ** 3)
        return parameters(model)
    assert_same(run(sharding), run(None), exact=exact_reduction(hvd.size()))


@pytest.mark.parametrize("sharding", STAGES)
def test_synchronize_then_step_in_skip_synchronize(sharding, size):
    model, optimizer = make(sharding=sharding)
    x, y = batch(0, hvd.rank())
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.synchronize()
    with optimizer.skip_synchronize():
        optimizer.step()
    optimizer.zero_grad()
    reference, replicated = make()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    replicated.step()
    assert_same(parameters(model), parameters(reference), exact=exact_reduction(size))


def test_wrapped_optimizer_behaves_like_its_class(size):
    model, optimizer = make(torch.optim.AdamW, "gradients")
    assert isinstance(optimizer, torch.optim.AdamW)
    assert [p for g in optimizer.param_groups for p in g["params"]] == list(model.parameters())
    train(model, optimizer, steps=1)
    # the groups show the parameters again after the step
    assert [p for g in optimizer.param_groups for p in g["params"]] == list(model.parameters())


@pytest.mark.parametrize("sharding", STAGES)
def test_sharded_inside_a_process_set_local_outside(sharding, rank, size):
    """Sharded among ranks 0 and 1 only; a rank outside the set steps on its
    own gradients, as Horovod's process_set= does."""
    if size < 3:
        pytest.skip("a set of two ranks smaller than the job needs three")
    pair = hvd.add_process_set([0, 1])
    try:
        model, optimizer = make(process_set=pair)
        train(model, optimizer)
        expected = parameters(model)
        model, optimizer = make(sharding=sharding, process_set=pair)
        train(model, optimizer)
        assert_same(parameters(model), expected, exact=True)
    finally:
        hvd.remove_process_set(pair)


@pytest.mark.parametrize("sharding", STAGES)
def test_hybrid_sharding_matches_replicated_training(sharding, rank, size):
    """Shards inside sets of two ranks (of one rank at 2 and 3 ranks),
    replicated across them (FSDP's HYBRID_SHARD): the parameters of plain
    replicated training over every rank."""
    if size == 1:
        pytest.skip("hybrid sharding needs two ranks")
    width = 2 if size % 2 == 0 and size > 2 else 1

    def process_set(ranks):
        return hvd.global_process_set if len(ranks) == size else hvd.add_process_set(ranks)

    shard_sets = [process_set(list(range(start, start + width)))
                  for start in range(0, size, width)]
    replica_sets = [process_set(list(range(offset, size, width))) for offset in range(width)]
    try:
        model, optimizer = make()
        train(model, optimizer)
        expected = parameters(model)
        model, optimizer = make(sharding=sharding, process_set=shard_sets[rank // width],
                                replica_process_set=replica_sets[rank % width])
        assert optimizer._hora_layout.size == width
        train(model, optimizer)
        assert_same(parameters(model), expected)
        assert_identical_on_every_rank(model)
    finally:
        for made in shard_sets + replica_sets:
            if made is not hvd.global_process_set:
                hvd.remove_process_set(made)


@pytest.mark.parametrize("sharding", STAGES)
@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_buckets_large_enough_for_the_ring(sharding, compression, rank, size):
    """Buckets past 64 KiB are reduce-scattered around hora's ring, in place
    in the flat bucket (widened to float32 first when sent as float16).
    SGD: at 3 ranks the ring adds in another order than the replicated
    allreduce, and Adam magnifies the last bit of near-zero gradients."""
    codec = getattr(hvd.Compression, compression)

    def run(sharding):
        torch.manual_seed(11)
        model = torch.nn.Sequential(torch.nn.Linear(128, 301), torch.nn.Tanh(),
                                    torch.nn.Linear(301, 67))
        optimizer = hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
            named_parameters=model.named_parameters(), sharding=sharding, compression=codec,
            **model_option(sharding, model))
        for step in range(3):
            x = torch.randn(5, 128, generator=torch.Generator().manual_seed(step * 10 + rank))
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        return parameters(model)
    assert_same(run(sharding), run(None), exact=exact_reduction(size))


# (stage 3 owns the parameters' memory: they are replaced at every gather)
@pytest.mark.parametrize("sharding", STAGES[:2])
def test_parameters_given_new_memory_between_steps(sharding, size):
    """The sharded optimizer makes a bucket's parameters views of one flat
    buffer; parameters given new memory (``p.data = ...``) are flattened
    again, their optimizer state kept."""
    model, optimizer = make()
    train(model, optimizer, steps=4)
    expected = parameters(model)
    model, optimizer = make(sharding=sharding)
    train(model, optimizer, steps=2)
    for p in model.parameters():
        p.data = p.data.clone()
    train(model, optimizer, steps=2, first_step=2)
    assert_same(parameters(model), expected, exact=exact_reduction(size))


@pytest.mark.parametrize("count", [5, 40000, 2 << 20])
def test_allgather_into_a_given_output(count, rank, size):
    """The allgather the sharded optimizer gathers parameters with: straight
    into the caller's buffer (MPI's up to 16 MiB, the ring above), the
    rank's own rows possibly a view of it; an output of the wrong size fails
    that rank's call alone, and the job goes on."""
    from hora.common._adapter.handles import Handle, synchronize
    from hora.torch._collectives import start_allgather_into
    rows = [count + r for r in range(size)]
    begin = sum(rows[:rank])
    output = torch.full((sum(rows),), -1.0)
    output[begin:begin + rows[rank]] = torch.arange(rows[rank], dtype=torch.float32) + rank
    works = start_allgather_into(output[begin:begin + rows[rank]], output, "sharding.into")
    synchronize(Handle(works, lambda ws: None))
    expected = torch.cat([torch.arange(n, dtype=torch.float32) + r for r, n in enumerate(rows)])
    assert torch.equal(output, expected)
    mine = torch.arange(rows[rank], dtype=torch.float32)
    wrong = torch.empty(sum(rows) + (1 if rank == 0 else 0))
    works = start_allgather_into(mine, wrong, "sharding.into.wrong")
    if rank == 0:
        with pytest.raises(ValueError, match="the output holds .* bytes but the rows every rank "
                                             "gathers hold"):
            synchronize(Handle(works, lambda ws: None))
    else:
        synchronize(Handle(works, lambda ws: None))
        assert torch.equal(wrong, torch.cat([torch.arange(n, dtype=torch.float32)
                                             for n in rows]))
    hvd.barrier()
