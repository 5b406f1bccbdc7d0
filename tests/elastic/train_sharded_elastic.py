"""An elastic run of the sharded optimizer (HORA_TEST_SHARDING, default
"gradients"; Adam) whose world changes size: every batch is a global batch of 12 samples made
from (epoch, batch) alone and split evenly among the ranks (12 divides by
1, 2, 3 and 4), so every world size computes the same averaged gradients
and the run ends like an uninterrupted one, up to the order of sums.

HORA_TEST_STEP_SLEEP slows every step down by that many seconds (so that
horarun's discovery, polled every second, sees the hosts change before the
run ends). HORA_TEST_HOSTS names the discovery script's host file. On
launch 0 the last rank writes "localhost:<size - 1>" into it and SIGKILLs
itself before epoch 0 batch 5 (HORA_TEST_SHRINK=1); on the launch after,
rank 0 writes "localhost:<size + 1>" before epoch 1 batch 2, and the world
grows back at the next commit. HORA_TEST_GROW=1 writes that on the first
launch instead, before epoch 0 batch 2 (with no loss before).
HORA_TEST_LEAVE=<n> makes rank 0 of the first world write
"localhost:<size - n>" there before epoch 0 batch 2 (nobody killed): in
place the highest n ranks leave at the next commit and the others go on.
HORA_TEST_KILL=<rank>[,<rank>...] (no host file) SIGKILLs those ranks of
the first world before epoch 0 batch 5 instead, once and together (the
highest kills the others): in place the others
go on from the last commit and a replacement joins later. At the end every
rank saves its parameters and the full optimizer state to
HORA_TEST_OUT.rank<N>.pt.

HORA_TEST_AWAIT_SIZE=<n>: a world smaller than n that reaches the last
epoch waits there for new processes to join, committing every 0.25 s (a
join happens at a commit), for at most 120 s; so a slow start of a
replacement cannot let the run end before it joins. The wait is counted
in rounds, not read from a clock, so every rank commits as often.
"""

import os
import signal
import time

import torch
import torch.nn.functional as F

import hora.torch as hvd

EPOCHS, BATCHES, COMMIT_EVERY, GLOBAL_BATCH = 3, 8, 2, 12

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 33), torch.nn.Tanh(), torch.nn.Linear(33, 3))
sharding = os.environ.get("HORA_TEST_SHARDING", "gradients")
optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters(),
                                     sharding=sharding,
                                     **({"model": model} if sharding == "parameters" else {}))
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0,
                               resets_seen=0)
launch = int(os.environ.get("HORA_ELASTIC_RESTARTS", "0"))
hosts = os.environ.get("HORA_TEST_HOSTS")
shrink = os.environ.get("HORA_TEST_SHRINK") == "1"
step_sleep = float(os.environ.get("HORA_TEST_STEP_SLEEP", "0"))
await_size = int(os.environ.get("HORA_TEST_AWAIT_SIZE", "0"))
leave = int(os.environ.get("HORA_TEST_LEAVE", "0"))


kill = os.environ.get("HORA_TEST_KILL")
resets = []


def count_reset():
    # what a reset callback changes (a plain attribute, an optimizer's
    # settings) reaches every rank, new processes included
    resets.append(hvd.size())
    state.resets_seen += 1
    for group in optimizer.param_groups:
        group["resets_seen"] = state.resets_seen


state.register_reset_callbacks([count_reset])
first_world = launch == 0 and "HORA_ELASTIC_JOINER_ID" not in os.environ
victims = sorted(int(r) for r in kill.split(",")) if kill else []
if first_world and hvd.rank() in victims:
    with open(f"{os.environ['HORA_TEST_OUT']}.pid{hvd.rank()}", "w") as f:
        f.write(str(os.getpid()))

# Faults inside hora's own recovery machinery, in the first world only:
# HORA_TEST_KILL_IN_COPY=<rank> SIGKILLs that rank as it starts copying its
# part of commit 2 to its neighbour; HORA_TEST_KILL_IN_RESTORE=<rank>
# SIGKILLs that rank of the world re-formed after HORA_TEST_KILL's loss
# while it restores the last commit (a second loss during recovery).
in_copy = os.environ.get("HORA_TEST_KILL_IN_COPY")
in_restore = os.environ.get("HORA_TEST_KILL_IN_RESTORE")
if first_world and (in_copy or in_restore):
    from hora.common.elastic import buddy

    exchange, forget_after = buddy.BuddyCopies.exchange, buddy.BuddyCopies.forget_after

    def exchange_or_die(self, commit, part):
        if in_copy and commit == 2 and not resets and hvd.rank() == int(in_copy):
            os.kill(os.getpid(), signal.SIGKILL)
        exchange(self, commit, part)

    def forget_after_or_die(self, commit):
        if in_restore and not resets and hvd.size() == 3 and hvd.rank() == int(in_restore):
            os.kill(os.getpid(), signal.SIGKILL)
        forget_after(self, commit)

    buddy.BuddyCopies.exchange = exchange_or_die
    buddy.BuddyCopies.forget_after = forget_after_or_die


def change_world():
    if kill is not None and first_world and not resets and (state.epoch, state.batch) == (0, 5) \
            and hvd.rank() == max(victims):
        for r in victims[:-1]:  # at once, before the others notice
            with open(f"{os.environ['HORA_TEST_OUT']}.pid{r}") as f:
                os.kill(int(f.read()), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("HORA_TEST_GROW") == "1" and hosts and first_world and not resets \
            and (state.epoch, state.batch) == (0, 2) and hvd.rank() == 0:
        with open(hosts, "w") as f:  # in place: one more slot, nothing lost
            f.write(f"localhost:{hvd.size() + 1}\n")
    if leave and hosts and first_world and not resets and (state.epoch, state.batch) == (0, 2) \
            and hvd.rank() == 0:
        with open(hosts, "w") as f:  # in place: ranks leave, nothing lost
            f.write(f"localhost:{hvd.size() - leave}\n")
    if not (shrink and hosts):
        return
    if launch == 0 and (state.epoch, state.batch) == (0, 5) and hvd.rank() == hvd.size() - 1:
        with open(hosts, "w") as f:
            f.write(f"localhost:{hvd.size() - 1}\n")
        os.kill(os.getpid(), signal.SIGKILL)
    if launch == 1 and (state.epoch, state.batch) == (1, 2) and hvd.rank() == 0:
        with open(hosts, "w") as f:
            f.write(f"localhost:{hvd.size() + 1}\n")


def await_growth():
    if state.epoch == EPOCHS - 1 and state.batch == 0 and hvd.size() < await_size:
        for _ in range(480):
            time.sleep(0.25)
            state.commit()  # a join interrupts this, and train() starts again
        raise RuntimeError(f"no process joined the world of {hvd.size()} in 120 s")


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"sharded world of {hvd.size()} from epoch {state.epoch} batch {state.batch} "
              f"(launch {launch})", flush=True)
    while state.epoch < EPOCHS:
        while state.batch < BATCHES:
            await_growth()
            change_world()
            time.sleep(step_sleep)
            generator = torch.Generator().manual_seed(state.epoch * 1000 + state.batch)
            x = torch.randn(GLOBAL_BATCH, 8, generator=generator)
            y = torch.stack([x.sum(1), x[:, 0] * x[:, 1], x.abs().max(1).values], dim=1)
            share = GLOBAL_BATCH // hvd.size()
            mine = slice(hvd.rank() * share, (hvd.rank() + 1) * share)
            optimizer.zero_grad()
            F.mse_loss(model(x[mine]), y[mine]).backward()
            optimizer.step()
            state.batch += 1
            if state.batch % COMMIT_EVERY == 0:
                state.commit()
        state.batch = 0
        state.epoch += 1
        state.commit()


train(state)
full = optimizer.state_dict()
out = os.environ.get("HORA_TEST_OUT")
with optimizer.gathered_parameters(writeback=False):
    params = [p.detach().clone() for p in model.parameters()]
if out:
    torch.save({"params": params, "size": hvd.size(), "optimizer": full,
                "resets_seen": state.resets_seen},
               f"{out}.rank{hvd.rank()}.pt")
