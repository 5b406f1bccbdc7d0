"""The sharded DistributedOptimizer on CUDA tensors (one rank, a GPU):
gradients go through NCCL's reducescatter and the updated shards through
its allgather (GPU buckets keep their own parameters: the flat buffers and
the in-place reducescatter are for host memory), stage 3's blocks gather
their parameters through NCCL's allgather into a buffer of the engine's,
copied into the parameters' storage, and training ends where replicated
training ends. Several ranks on one GPU: tests/gpu/shared_gpu_job.py."""

import pytest
import torch

import hora.torch as hvd


def train(sharding, steps=4):
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 10)).cuda()
    options = {"model": model} if sharding == "parameters" else {}
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3),
                                         named_parameters=model.named_parameters(),
                                         sharding=sharding, **options)
    generator = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(steps):
        x = torch.randn(32, 64, device="cuda", generator=generator)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.clip_grad_norm_(1.0)
        optimizer.step()
    torch.cuda.synchronize()
    if sharding is None:
        return [p.detach().clone() for p in model.parameters()]
    with optimizer.gathered_parameters(writeback=False):
        return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("sharding", ["optimizer_state", "gradients", "parameters"])
def test_sharded_training_on_the_gpu_matches_replicated(sharding):
    expected = train(None)
    got = train(sharding)
    for a, b in zip(got, expected):
        assert a.is_cuda
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_stage_3_frees_the_gpu_parameters_between_uses():
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)]).cuda()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(),
                                         sharding="parameters", model=model)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    model(torch.randn(8, 1024, device="cuda")).sum().backward()
    optimizer.step()
    torch.cuda.synchronize()
    assert all(p.numel() == 0 and p.is_cuda for p in model.parameters())
    # one rank holds every shard (4.2 M floats): the whole weights are not
    # held twice after a step
    assert torch.cuda.memory_allocated() - held < 2 << 20
