"""Run under horarun by test_gpu_ranks.py: every rank on the same GPU (or
on GPU local_rank with --own-gpu). Every collective on CUDA tensors against
the values the ranks' inputs imply, then a few steps of training with
DistributedOptimizer (fp16 compression) and SyncBatchNorm on the GPU, which
must leave identical parameters on every rank, and sharded training (ZeRO-2
and ZeRO-3) that must end where replicated training ends. Prints "rank R ok"."""
import contextlib
import sys

import torch
import torch.nn.functional as F
from torch import nn

import hora.torch as hvd

hvd.init()
rank, n = hvd.rank(), hvd.size()
own_gpu = "--own-gpu" in sys.argv
torch.cuda.set_device(hvd.local_rank() if own_gpu else 0)
cuda = torch.device("cuda", torch.cuda.current_device())
total = n * (n + 1) / 2  # sum over ranks of (rank + 1)


def check(what, ok):
    if not ok:
        print(f"rank {rank} FAILED: {what}", flush=True)
        sys.exit(4)


try:
    # allreduce: every dtype the optimizer and users send, fused and alone
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64):
        x = torch.full((1001,), rank + 1, dtype=dtype, device=cuda)
        out = hvd.allreduce(x, op=hvd.Sum, name=f"sum.{dtype}")
        check(f"allreduce {dtype}", out.device == cuda and torch.all(out.float() == total).item())
    avg = hvd.allreduce(torch.full((7,), float(rank), device=cuda), op=hvd.Average, name="avg")
    check("average", torch.allclose(avg, torch.full_like(avg, (n - 1) / 2)))
    mx = hvd.allreduce(torch.full((3,), float(rank), device=cuda), op=hvd.Max, name="max")
    check("max", torch.all(mx == n - 1).item())
    group = [torch.full((k + 1,), float(rank + 1), device=cuda) for k in range(40)]
    outs = hvd.grouped_allreduce(group, op=hvd.Sum, name="group")
    check("grouped", all(torch.all(o == total).item() for o in outs))
    scaled = hvd.allreduce(torch.ones(5, device=cuda), op=hvd.Sum, prescale_factor=2.0,
                           postscale_factor=0.5, name="scaled")
    check("scaling", torch.all(scaled == n).item())
    inplace = torch.full((9,), float(rank + 1), device=cuda)
    hvd.allreduce_(inplace, op=hvd.Sum, name="inplace")
    check("in place", torch.all(inplace == total).item())
    # the collectives whose output size comes from negotiation
    g = hvd.allgather(torch.full((rank + 1, 2), float(rank), device=cuda), name="gather")
    rows = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(n)])
    check("allgather", g.device == cuda and torch.equal(g.cpu(), rows))
    b = hvd.broadcast(torch.full((4,), float(rank), device=cuda), root_rank=n - 1, name="bcast")
    check("broadcast", torch.all(b == n - 1).item())
    b_ = torch.full((4,), float(rank), device=cuda)
    hvd.broadcast_(b_, root_rank=0, name="bcast_")
    check("broadcast_", torch.all(b_ == 0).item())
    sent = torch.arange(n, dtype=torch.float32, device=cuda) + 100 * rank
    got = hvd.alltoall(sent, name="a2a")
    check("alltoall", torch.equal(got.cpu(), torch.tensor([100.0 * r + rank for r in range(n)])))
    rs = hvd.reducescatter(torch.ones(n * 3, device=cuda) * (rank + 1), op=hvd.Sum, name="rs")
    check("reducescatter", rs.shape == (3,) and torch.all(rs == total).item())
    obj = hvd.broadcast_object({"from": rank}, root_rank=0, name="obj")
    check("broadcast_object", obj == {"from": 0})
except Exception as error:
    print(f"rank {rank} error: {type(error).__name__}: {error}", flush=True)
    sys.exit(3)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = hvd.SyncBatchNorm(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(F.relu(self.norm(self.conv(x))).flatten(1))


torch.manual_seed(rank)  # different weights: the broadcast must fix them
model = Net().to(cuda)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.fp16)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
generator = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
losses = []
for _ in range(6):
    data = torch.randn(16, 3, 8, 8, generator=generator).to(cuda)
    target = torch.randint(0, 10, (16,), generator=generator).to(cuda)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    losses.append(float(loss))
state = torch.cat([t.detach().float().reshape(-1) for t in model.state_dict().values()])
spread = hvd.allreduce(state, op=hvd.Max, name="spread.max") - \
    hvd.allreduce(state, op=hvd.Min, name="spread.min")
check(f"identical parameters (spread {float(spread.abs().max())})",
      float(spread.abs().max()) == 0.0)
check("running statistics moved", float(model.norm.running_var.sum()) != 8.0)


def train_mlp(sharding):
    """Six Adam steps of an MLP, each rank its own batches; the final weights."""
    torch.manual_seed(11)
    mlp = nn.Sequential(nn.Linear(32, 300), nn.Tanh(), nn.Linear(300, 7)).to(cuda)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(mlp.parameters(), lr=1e-2),
                                   named_parameters=mlp.named_parameters(), sharding=sharding,
                                   **({"model": mlp} if sharding == "parameters" else {}))
    data_generator = torch.Generator().manual_seed(300 + rank)
    for _ in range(6):
        opt.zero_grad()
        mlp(torch.randn(8, 32, generator=data_generator).to(cuda)).pow(2).mean().backward()
        opt.step()
    with opt.gathered_parameters(writeback=False) if sharding else contextlib.nullcontext():
        return torch.cat([p.detach().reshape(-1) for p in mlp.parameters()])


# sharded training (ZeRO-2 and ZeRO-3) on GPU tensors ends where replicated
# training ends, and every rank holds the same weights
replicated = train_mlp(None)
for stage in ("gradients", "parameters"):
    sharded = train_mlp(stage)
    distance = float((sharded - replicated).norm() / replicated.norm())
    check(f"sharding={stage!r} weights equal replicated (relative distance {distance:.2e})",
          distance < 1e-6)
    sharded_spread = hvd.allreduce(sharded, op=hvd.Max, name=f"{stage}.max") - \
        hvd.allreduce(sharded, op=hvd.Min, name=f"{stage}.min")
    check(f"sharding={stage!r} weights identical on every rank",
          float(sharded_spread.abs().max()) == 0.0)
print(f"rank {rank} ok: losses {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
hvd.shutdown()
