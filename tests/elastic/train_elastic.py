"""A small elastic PyTorch training run for the elastic tests: data that
depends only on (epoch, batch, rank), SGD with momentum (so the optimizer's
state must survive too), a commit every COMMIT_EVERY batches.

HORA_TEST_STEP_SLEEP slows every step down by that many seconds.
HORA_TEST_FAULT="<launch>:<rank>:<epoch>:<batch>:<how>[,...]" makes rank
<rank> of launch number <launch> (HORA_ELASTIC_RESTARTS; "*" for every
launch) fail before that batch: "kill" (SIGKILL), "raise" (an exception in
the training code), or "in-commit" (SIGKILL while its next commit is being
written); "at-start" SIGKILLs it right after hvd.init(), while the world
forms (epoch and batch ignored); "joiner-at-start" does that to the
replacement process with id <rank> (an in-place world's replacements get
ids from the launch's size on) right after its hvd.init(), and
"joiner-in-sync" while it takes the state (the model's parameters taken,
the optimizer's not); "in-sync" SIGKILLs rank <rank> while it takes part in
a state sync after <batch> reset callbacks (in place: 1 after a loss, 2
after a replacement then joined), with the same split. At the end every
rank saves its parameters (and whether it was a replacement) to
HORA_TEST_OUT.rank<N>.pt. HORA_TEST_LINGER="<rank>:<seconds>" keeps that
rank of the last world busy for that long after it is done, before it exits.
HORA_TEST_END_SIZE=<n> trains on, an epoch at a time (at most
EXTRA_EPOCHS more), until the world has <n> ranks again: a replacement
that starts slowly on a loaded machine still joins before the end.
"""

import os
import signal
import sys
import time

import torch
import torch.nn.functional as F

import hora.torch as hvd

EPOCHS, BATCHES, COMMIT_EVERY, EXTRA_EPOCHS = 3, 12, 4, 15

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, epoch=0, batch=0, resets=0)
faults = [f.split(":") for f in os.environ.get("HORA_TEST_FAULT", "").split(",") if f]
step_sleep = float(os.environ.get("HORA_TEST_STEP_SLEEP", "0"))
end_size = int(os.environ.get("HORA_TEST_END_SIZE", "0"))
launch = os.environ.get("HORA_ELASTIC_RESTARTS", "0")
# Faults name a rank of the world the process started in: a world re-formed
# in place (--elastic-in-place) numbers the survivors anew.
START_RANK = hvd.rank()
JOINER_ID = os.environ.get("HORA_ELASTIC_JOINER_ID")
for when, rank, _, _, how in faults:
    if how == "at-start" and when in ("*", launch) and int(rank) == START_RANK:
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "joiner-at-start" and rank == JOINER_ID:
        os.kill(os.getpid(), signal.SIGKILL)


def on_reset():
    state.resets += 1


def die_in_sync(sync):
    """The optimizer's part of state.sync(), which SIGKILLs this process
    instead when a fault says so (the model's part went before)."""
    def faulty_sync():
        for when, rank, _, resets, how in faults:
            if how == "joiner-in-sync" and rank == JOINER_ID:
                os.kill(os.getpid(), signal.SIGKILL)
            if (how == "in-sync" and when in ("*", launch) and JOINER_ID is None
                    and int(rank) == START_RANK and int(resets) == state.resets):
                os.kill(os.getpid(), signal.SIGKILL)
        sync()
    return faulty_sync


optimizer_state = state._handlers["optimizer"]
optimizer_state.sync = die_in_sync(optimizer_state.sync)


state.register_reset_callbacks([on_reset])


def maybe_fail():
    for fault in faults:
        fail(*fault)


def fail(when, rank, epoch, batch, how):
    if when not in ("*", launch) or int(rank) != START_RANK or how.endswith("at-start"):
        return
    if JOINER_ID is not None:  # faults name the launch's ranks
        return
    if (int(epoch), int(batch)) != (state.epoch, state.batch):
        return
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "raise":
        raise RuntimeError(f"injected failure at epoch {state.epoch} batch {state.batch}")
    elif how == "in-commit":
        write = state._store.write

        def write_then_die(commit, snapshot):
            write(commit, snapshot)
            os.kill(os.getpid(), signal.SIGKILL)
        state._store.write = write_then_die


@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"world of {hvd.size()} from epoch {state.epoch} batch {state.batch} "
              f"(launch {launch}, resets {state.resets})", flush=True)
    # every rank of a world sees the same size and epoch, so all stop together
    while state.epoch < EPOCHS or (hvd.size() < end_size
                                   and state.epoch < EPOCHS + EXTRA_EPOCHS):
        while state.batch < BATCHES:
            maybe_fail()
            time.sleep(step_sleep)
            generator = torch.Generator().manual_seed(
                state.epoch * 1000 + state.batch * 10 + hvd.rank())
            x = torch.randn(16, 8, generator=generator)
            y = x.sum(dim=1, keepdim=True)
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            optimizer.step()
            state.batch += 1
            if state.batch % COMMIT_EVERY == 0:
                state.commit()
        state.batch = 0
        state.epoch += 1
        state.commit()


train(state)
out = os.environ.get("HORA_TEST_OUT")
if out:
    torch.save({"params": [p.detach().clone() for p in model.parameters()],
                "size": hvd.size(), "resets": state.resets, "joiner": JOINER_ID},
               f"{out}.rank{hvd.rank()}.pt")
print(f"rank {hvd.rank()} done", file=sys.stderr, flush=True)
linger = os.environ.get("HORA_TEST_LINGER")
if linger and int(linger.split(":")[0]) == hvd.rank():
    time.sleep(float(linger.split(":")[1]))
