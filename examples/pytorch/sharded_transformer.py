"""Trains a transformer language model that does not fit replicated within a
per-rank memory limit, by sharding the gradients and Adam's state over the
ranks (hvd.DistributedOptimizer(..., sharding="gradients")), or the weights
as well (sharding="parameters", for a model whose stage-2 run does not fit
either).

    horarun -np 4 python examples/pytorch/sharded_transformer.py
    horarun -np 4 python examples/pytorch/sharded_transformer.py --sharding none
    horarun -np 4 python examples/pytorch/sharded_transformer.py --sharding parameters \
        --layers 16
    horarun -np 4 python examples/pytorch/sharded_transformer.py --layers 16

Each rank may allocate at most --memory-limit-mib MiB beyond what it holds
after start-up: the limit is enforced (the process's data segment, through
RLIMIT_DATA), so the replicated run stops with the allocator's error while
the sharded one trains; at 16 blocks (41 M parameters) sharding="gradients"
runs out as well and sharding="parameters" trains. The data is a fixed Markov chain over the
vocabulary: the loss falls from ln(vocabulary) towards the chain's entropy,
which the script prints for comparison.
"""

import argparse
import ctypes
import math
import resource

import torch
import torch.nn.functional as F
from torch import nn

import hora.torch as hvd


class LanguageModel(nn.Module):
    def __init__(self, vocabulary, width, layers, context):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, max(1, width // 64), 4 * width, dropout=0.0,
                                       batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocabulary)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(context))

    def forward(self, tokens):
        hidden = self.embedding(tokens) + self.position[:tokens.shape[1]]
        mask = self.causal[:tokens.shape[1], :tokens.shape[1]]
        for block in self.blocks:
            hidden = block(hidden, src_mask=mask, is_causal=True)
        return self.head(self.norm(hidden))


class MarkovChain:
    """Sequences over `used` of the vocabulary's tokens, each followed by one
    of `branches` of them at fixed random probabilities: structure a small
    model learns within a few dozen steps, with a known entropy."""

    def __init__(self, vocabulary, used=256, branches=4, seed=0):
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randperm(vocabulary, generator=generator)[:used]
        self.next = self.tokens[torch.randint(0, used, (vocabulary, branches),
                                              generator=generator)]
        self.weights = torch.rand(vocabulary, branches, generator=generator) + 0.1
        self.weights /= self.weights.sum(1, keepdim=True)

    def entropy(self):
        weights = self.weights[self.tokens]
        return float(-(weights * weights.log()).sum(1).mean())

    def batch(self, size, length, generator):
        tokens = torch.empty(size, length + 1, dtype=torch.long)
        start = torch.randint(0, len(self.tokens), (size,), generator=generator)
        tokens[:, 0] = self.tokens[start]
        for t in range(length):
            choice = torch.multinomial(self.weights[tokens[:, t]], 1, generator=generator)
            tokens[:, t + 1] = self.next[tokens[:, t], choice[:, 0]]
        return tokens[:, :-1], tokens[:, 1:]


def data_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def peak_resident_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def return_freed_memory():
    """glibc raises its mmap threshold each time a large block is freed, after
    which blocks up to that size stay in its heap when freed: the gradients
    sharding frees, and the weights sharding="parameters" gathers and frees
    block by block, would then still count against the limit, in holes of the
    heap. A fixed low threshold (what MALLOC_MMAP_THRESHOLD_=65536 and
    MALLOC_TRIM_THRESHOLD_=131072 in the environment also do) hands every
    block of 64 KiB or more back to the system when it is freed."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 64 << 10)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 << 10)  # M_TRIM_THRESHOLD
    except OSError:
        pass  # not glibc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sharding", default="gradients",
                        choices=["none", "optimizer_state", "gradients", "parameters"])
    parser.add_argument("--memory-limit-mib", type=float, default=450,
                        help="what each rank may allocate beyond its start-up memory")
    parser.add_argument("--vocabulary", type=int, default=16384)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--context", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per rank")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    return_freed_memory()
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # The limit counts from here: hora, torch and MPI are loaded.
    limit = data_bytes() + int(args.memory_limit_mib * 2**20)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.RLIM_INFINITY))

    model = LanguageModel(args.vocabulary, args.width, args.layers, args.context)
    parameters = sum(p.numel() for p in model.parameters())
    sharding = None if args.sharding == "none" else args.sharding
    # before wrapping: with sharding="parameters" the weights are whole only
    # inside forward, backward and optimizer.gathered_parameters() afterwards
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=args.lr),
        named_parameters=model.named_parameters(), sharding=sharding,
        **({"model": model} if sharding == "parameters" else {}))
    chain = MarkovChain(args.vocabulary)
    if hvd.rank() == 0:
        print(f"{parameters / 1e6:.1f} M parameters on {hvd.size()} ranks, sharding={sharding}; "
              f"replicated Adam training needs {16 * parameters / 2**20:.0f} MiB per rank for "
              f"weights, gradients and optimizer state, the limit is "
              f"{args.memory_limit_mib:.0f} MiB; loss starts near "
              f"ln({args.vocabulary}) = {math.log(args.vocabulary):.2f}, the chain's entropy is "
              f"{chain.entropy():.2f}", flush=True)
    generator = torch.Generator().manual_seed(1000 + hvd.rank())
    for step in range(1, args.steps + 1):
        inputs, targets = chain.batch(args.batch_size, args.context, generator)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(inputs).reshape(-1, args.vocabulary), targets.reshape(-1))
        loss.backward()
        optimizer.clip_grad_norm_(1.0)
        optimizer.step()
        if step % 10 == 0 or step in (1, args.steps):
            average = hvd.allreduce(loss.detach(), name="loss")
            if hvd.rank() == 0:
                print(f"step {step:4d} loss {float(average):.3f}", flush=True)
    peak = hvd.allgather_object(peak_resident_bytes())
    if hvd.rank() == 0:
        print(f"trained within the limit; peak resident memory per rank "
              f"{max(peak) / 2**20:.0f} MiB (with start-up)", flush=True)


if __name__ == "__main__":
    main()
