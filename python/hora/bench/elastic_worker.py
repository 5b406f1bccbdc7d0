"""The training job `python -m hora.bench elastic` measures recovery on:
prints timestamped events (``bench-elastic <event> <time>``), and the last
rank of the first world SIGKILLs itself at step HORA_BENCH_KILL_STEP. In
place (HORA_ELASTIC_IN_PLACE=1) the survivors report when their reset
callback ran (the world re-formed and the state synced) and their first
step after it; relaunched, rank 0 of the next world reports init, restore
and its first step."""

import os
import signal
import time

import torch

import hora.torch as hvd


def event(name):
    print(f"bench-elastic {name} {time.time():.6f}", flush=True)


hvd.init()
launch = int(os.environ.get("HORA_ELASTIC_RESTARTS", "0"))
victim = hvd.size() - 1
resets = [0]
if launch > 0 and hvd.rank() == 0:
    event("initialized")
kill_step = int(os.environ.get("HORA_BENCH_KILL_STEP", "30"))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)


def on_reset():
    resets[0] += 1
    if launch == 0 and hvd.rank() == 0:
        event("reset")


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    recovering = launch > 0 or resets[0] > 0
    if launch > 0 and hvd.rank() == 0:
        event("restored")
    first = True
    while state.step < 2 * kill_step:
        if launch == 0 and resets[0] == 0 and hvd.rank() == victim and state.step == kill_step:
            event("killed")
            os.kill(os.getpid(), signal.SIGKILL)
        x = torch.randn(32, 64)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        if first and recovering and hvd.rank() == 0:
            event("first_step")
        first = False
        state.step += 1
        if state.step % 10 == 0:
            state.commit()


train(state)
