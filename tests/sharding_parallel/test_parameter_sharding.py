"""Stage 3 (``sharding="parameters"``): the parameters live as shards,
gathered around each block's forward and backward; training ends where
replicated training ends, and the parameters hold no memory between uses."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from sharding_helpers import (  # noqa: E402
    assert_same, make, parameters, train)
from torch import nn  # noqa: E402


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 3 * width + 1)
        self.down = nn.Linear(3 * width + 1, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class Tiny(nn.Module):
    """Blocks in a ModuleList, an embedding and a head outside them, a
    parameter used directly in the model's forward, and optionally a head
    tied to the embedding (a parameter shared by two modules)."""

    def __init__(self, width=12, blocks=3, vocabulary=29, tied=False, seed=3):
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.randn(5, width) * 0.1)
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, vocabulary, bias=False)
        if tied:
            self.head.weight = self.embedding.weight

    def forward(self, tokens, checkpoint=False):
        x = self.embedding(tokens) + self.position
        for block in self.blocks:
            if checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


def tokens(step, rank, k=0):
    g = torch.Generator().manual_seed(500 * step + 7 * rank + k)
    return torch.randint(0, 29, (3, 5), generator=g)


def wrap(model, sharding, optimizer_class=torch.optim.Adam, lr=0.01, **options):
    if sharding == "parameters":
        options["model"] = model
    return hvd.DistributedOptimizer(optimizer_class(model.parameters(), lr=lr),
                                    named_parameters=model.named_parameters(),
                                    sharding=sharding, **options)


def run(model, optimizer, steps=4, passes=1, clip=None, checkpoint=False):
    norms = []
    for step in range(steps):
        for k in range(passes):
            t = tokens(step, hvd.rank(), k)
            nn.functional.cross_entropy(model(t, checkpoint).flatten(0, 1),
                                        t.flatten()).backward()
        if clip is not None:
            norms.append(float(optimizer.clip_grad_norm_(clip)))
        optimizer.step()
        optimizer.zero_grad()
    return norms


def whole(model, optimizer):
    with optimizer.gathered_parameters(writeback=False):
        return [p.detach().clone() for p in model.parameters()]


def exact(size):
    return size <= 2  # see test_sharded_training.exact_reduction


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam, torch.optim.SGD],
                         ids=["Adam", "SGD"])
def test_stage_3_matches_replicated(tied, optimizer_class, size):
    model = Tiny(tied=tied)
    run(model, wrap(model, None, optimizer_class))
    expected = parameters(model)
    model = Tiny(tied=tied)
    optimizer = wrap(model, "parameters", optimizer_class)
    run(model, optimizer)
    got = whole(model, optimizer)
    assert_same(got, expected, exact=exact(size))
    gathered = hvd.allgather(torch.cat([p.reshape(-1) for p in got]).unsqueeze(0),
                             name="stage3.identical")
    assert all(torch.equal(row, gathered[0]) for row in gathered)


@pytest.mark.parametrize("bucket_bytes", [0, 200, None])
def test_a_model_without_containers_and_any_bucket_size(bucket_bytes, size):
    """sharding_helpers.Net has no ModuleList: its children are the units,
    and its 0-d parameter (used by the model's own forward) is the model's."""
    model, optimizer = make(bucket_bytes=bucket_bytes)
    train(model, optimizer)
    expected = parameters(model)
    model = make()[0]
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01), named_parameters=model.named_parameters(),
        sharding="parameters", model=model, bucket_bytes=bucket_bytes)
    train(model, optimizer)
    assert_same(whole(model, optimizer), expected, exact=exact(size))


def test_parameters_hold_no_memory_between_uses(size):
    model = Tiny()
    optimizer = wrap(model, "parameters")
    shards = optimizer._hora_shards
    total = sum(optimizer._hora_layout.numels)
    for _ in range(2):
        # outside forward and backward: empty parameters, freed buffers
        assert all(p.numel() == 0 for p in model.parameters())
        assert all(f.untyped_storage().nbytes() == 0 for f in shards.flat)
        held = sum(s.numel() for s in shards.shards)
        assert total // size - len(shards.shards) <= held <= total // size + len(shards.shards)
        seen = []

        def look(module, args, output, seen=seen):
            seen.append(
                (model.blocks[1].up.weight.shape, all(
                    shards.flat[b].untyped_storage().nbytes() > 0
                    for b in shards._units[shards._modules.index(model.blocks[2])]),
                 model.blocks[0].up.weight.numel() == 0))

        # inside block 1's forward
        hook = model.blocks[1].down.register_forward_hook(look)
        run(model, optimizer, steps=1)
        hook.remove()
        # inside block 1's forward: its parameters whole, block 2's being
        # gathered into its buffers (prefetched), block 0's freed
        assert seen[0] == ((37, 12), True, True)
        assert all(p.grad is None for p in model.parameters())


def test_gathered_parameters_saves_and_loads_the_model(size):
    model = Tiny()
    optimizer = wrap(model, "parameters")
    run(model, optimizer, steps=2)
    with pytest.raises(RuntimeError, match="'embedding.weight' is sharded.*gathered_parameters"):
        model.state_dict()
    with optimizer.gathered_parameters():
        saved = {k: v.clone() for k, v in model.state_dict().items()}
    assert saved["blocks.0.up.weight"].shape == (37, 12)
    run(model, optimizer, steps=1)
    with pytest.raises(RuntimeError, match="is sharded"):
        model.load_state_dict(saved)
    with optimizer.gathered_parameters():
        model.load_state_dict(saved)
    with optimizer.gathered_parameters(writeback=False):
        for key, value in model.state_dict().items():
            assert torch.equal(value, saved[key]), key
    # a plain model of the same shape takes the saved weights
    plain = Tiny(seed=99)
    plain.load_state_dict(saved)


def test_writeback_false_drops_changes(size):
    model = Tiny()
    optimizer = wrap(model, "parameters")
    before = whole(model, optimizer)
    with optimizer.gathered_parameters(writeback=False):
        with torch.no_grad():
            model.head.weight.add_(1.0)
    assert_same(whole(model, optimizer), before, exact=True)


def test_wrapping_takes_the_first_ranks_values(rank, size):
    """Each rank builds its model with its own seed: wrapping gives every
    rank rank 0's parameters (as broadcast_parameters would)."""
    reference = Tiny(seed=3)
    model = Tiny(seed=3 + rank)
    optimizer = wrap(model, "parameters")
    assert_same(whole(model, optimizer), parameters(reference), exact=True)


def test_broadcast_parameters_of_sharded_parameters(rank, size):
    """Sharded parameters are the same on every rank by construction (one
    set of shards): broadcasting them gathers, broadcasts and keeps them;
    a state dict of freed parameters is refused with what to do instead."""
    model = Tiny(seed=3)
    optimizer = wrap(model, "parameters")
    run(model, optimizer, steps=1)
    before = whole(model, optimizer)
    hvd.broadcast_parameters(model.named_parameters(), root_rank=size - 1)
    assert all(p.numel() == 0 for p in model.parameters())
    assert_same(whole(model, optimizer), before, exact=True)
    with pytest.raises(RuntimeError, match="inside `with optimizer.gathered_parameters"):
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with optimizer.gathered_parameters():
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    assert_same(whole(model, optimizer), before, exact=True)


def test_backward_passes_and_clipping(size):
    model = Tiny()
    expected_norms = run(model, wrap(model, None, backward_passes_per_step=2), passes=2, clip=0.5)
    expected = parameters(model)
    model = Tiny()
    optimizer = wrap(model, "parameters", backward_passes_per_step=2)
    norms = run(model, optimizer, passes=2, clip=0.5)
    assert norms == pytest.approx(expected_norms, rel=1e-5)
    assert_same(whole(model, optimizer), expected)


def test_compression(size):
    model = Tiny()
    run(model, wrap(model, None, compression=hvd.Compression.bf16))
    expected = parameters(model)
    model = Tiny()
    optimizer = wrap(model, "parameters", compression=hvd.Compression.bf16)
    run(model, optimizer)
    # bf16 sums of shards and of whole buckets may round differently
    for a, b in zip(whole(model, optimizer), expected):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)


def test_activation_checkpointing_and_evaluation(size):
    model = Tiny()
    run(model, wrap(model, None), checkpoint=True)
    expected = parameters(model)
    with torch.no_grad():
        expected_output = model(tokens(9, 0))
    model = Tiny()
    optimizer = wrap(model, "parameters")
    run(model, optimizer, checkpoint=True)
    assert_same(whole(model, optimizer), expected, exact=exact(size))
    with torch.no_grad():  # forward alone gathers and frees as well
        output = model(tokens(9, 0))
    torch.testing.assert_close(output, expected_output, rtol=1e-5, atol=1e-6)
    assert all(p.numel() == 0 for p in model.parameters())


class Twice(Tiny):
    """Block 0 runs twice per forward (its parameters gathered twice in
    forward, and its gradient accumulated from both uses)."""

    def forward(self, tokens, checkpoint=False):
        x = self.embedding(tokens) + self.position
        x = self.blocks[0](self.blocks[0](x))
        return self.head(self.blocks[2](self.blocks[1](x)))


def test_a_block_used_twice(size):
    model = Twice()
    run(model, wrap(model, None))
    expected = parameters(model)
    model = Twice()
    optimizer = wrap(model, "parameters")
    run(model, optimizer)
    assert_same(whole(model, optimizer), expected, exact=exact(size))


class Skipping(Tiny):
    """Rank 0 skips block 1 in forward, and the other ranks skip block 2 in
    backward (its output is detached): the gathers stay matched."""

    def forward(self, tokens, checkpoint=False):
        x = self.embedding(tokens) + self.position
        x = self.blocks[0](x)
        if hvd.rank() != 0:
            x = self.blocks[1](x)
        y = self.blocks[2](x)
        if hvd.rank() != 0:
            y = y.detach() + x
        return self.head(y)


@pytest.mark.parametrize("sharding", ["gradients", "parameters"])
def test_ranks_that_skip_different_blocks(sharding, size):
    """Also stage 2: the ranks launch their reductions in different orders."""
    model = Skipping()
    run(model, wrap(model, None))
    expected = parameters(model)
    model = Skipping()
    optimizer = wrap(model, sharding)
    run(model, optimizer)
    assert_same(parameters(model), expected, exact=exact(size))


def test_full_optimizer_state_dict_is_the_replicated_one(size):
    model = Tiny()
    replicated = wrap(model, None)
    run(model, replicated, steps=2)
    expected = replicated.state_dict()
    model = Tiny()
    optimizer = wrap(model, "parameters")
    run(model, optimizer, steps=2)
    got = optimizer.state_dict()
    assert got["state"].keys() == expected["state"].keys()
    for number, entry in expected["state"].items():
        for key, value in entry.items():
            torch.testing.assert_close(got["state"][number][key], value, rtol=1e-5, atol=1e-7)


def test_stage_3_needs_the_model_and_only_its_parameters():
    model = Tiny()
    with pytest.raises(ValueError, match="sharding='parameters'.* needs the model: pass model="):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(),
                                 sharding="parameters")
    with pytest.raises(ValueError, match="model= is for sharding='parameters'"):
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(),
                                 sharding="gradients", model=model)
    wrap(model, "parameters")
    with pytest.raises(ValueError, match="'position' is already held sharded"):
        wrap(model, "parameters")
    model = Tiny()
    other = nn.Linear(2, 2)
    params = list(model.parameters()) + list(other.parameters())
    names = list(model.named_parameters()) + [("other." + n, p)
                                              for n, p in other.named_parameters()]
    with pytest.raises(ValueError, match="'other.weight' is not a parameter of model"):
        hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), named_parameters=names,
                                 sharding="parameters", model=model)
