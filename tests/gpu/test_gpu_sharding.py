"""The sharded DistributedOptimizer on CUDA tensors (one rank, a GPU):
gradients go through NCCL's reducescatter and the updated shards through
its allgather (GPU buckets keep their own parameters: the flat buffers and
the in-place reducescatter are for host memory), and training ends where
replicated training ends; the peak of torch's GPU allocator shows the
gradients freed as they are reduced (stage 2)."""

import pytest
import torch

import hora.torch as hvd


def train(sharding, steps=4):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 10)).cuda()
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                         named_parameters=model.named_parameters(),
                                         sharding=sharding)
    generator = torch.Generator(device="cuda").manual_seed(7)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(steps):
        x = torch.randn(32, 64, device="cuda", generator=generator)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.clip_grad_norm_(1.0)
        optimizer.step()
    torch.cuda.synchronize()
    return [p.detach().clone() for p in model.parameters()], torch.cuda.max_memory_allocated()


@pytest.mark.parametrize("sharding", ["optimizer_state", "gradients"])
def test_sharded_training_on_the_gpu_matches_replicated(sharding):
    expected, _ = train(None)
    got, _ = train(sharding)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
