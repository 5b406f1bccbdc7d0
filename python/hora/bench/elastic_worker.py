"""The training job `python -m hora.bench elastic` measures recovery on:
prints timestamped events (``bench-elastic <event> <time>``), and the last
rank of the first world SIGKILLs itself at step HORA_BENCH_KILL_STEP. In
place (HORA_ELASTIC_IN_PLACE=1) the survivors report when their reset
callback ran (the world re-formed) and their first step after it; with a
replacement, the replacement reports its start and its first step, and
the survivors the commit at which it joined and their first step after;
relaunched, rank 0 of the next world reports init, restore and its first
step. With HORA_BENCH_GROW_FILE (a discovery script's hosts file) nothing
is killed: at that step rank 0 writes one more slot into the file and
reports it, and the new process and the ranks report as for a replacement.
With HORA_BENCH_LEAVE_FILE rank 0 writes one slot fewer there instead
(``slots_removed``): in place the last rank leaves at a commit, and rank 0
reports that commit (``leave_commit``) and its first step after
(``left_first_step``); relaunched, the next world reports as above.
HORA_BENCH_STEPS and HORA_BENCH_STEP_SLEEP set how long it trains;
HORA_BENCH_SHARDING shards Adam's state (``sharding=`` of
DistributedOptimizer) instead of the plain SGD; HORA_BENCH_CUDA=1 trains on
the GPU (the local rank's, modulo the GPUs there are). Rank 0 reports the mean
time its ``commit()`` calls took (``commit_mean``).

Under churn (HORA_BENCH_DEADLINE, a time; the bench kills ranks itself,
HORA_BENCH_KILL_STEP is then ignored) it trains until the deadline and
rank 0 reports the samples trained that count (``bench-elastic-samples
N``): a step rolled back by a relaunch does not count."""

import time

STARTED = time.time()  # before the imports: a replacement's start

import os  # noqa: E402
import signal  # noqa: E402

import torch  # noqa: E402

import hora.torch as hvd  # noqa: E402


def event(name, when=None):
    print(f"bench-elastic {name} {time.time() if when is None else when:.6f}", flush=True)


hvd.init()
launch = int(os.environ.get("HORA_ELASTIC_RESTARTS", "0"))
joiner = "HORA_ELASTIC_JOINER_ID" in os.environ
if joiner:
    event("joiner_started", STARTED)
victim = hvd.size() - 1
resets = [0]
if launch > 0 and hvd.rank() == 0:
    event("initialized")
kill_step = int(os.environ.get("HORA_BENCH_KILL_STEP", "30"))
steps = int(os.environ.get("HORA_BENCH_STEPS", str(2 * kill_step)))
step_sleep = float(os.environ.get("HORA_BENCH_STEP_SLEEP", "0"))
deadline = float(os.environ.get("HORA_BENCH_DEADLINE", "0"))
grow_file = os.environ.get("HORA_BENCH_GROW_FILE")
leave_file = os.environ.get("HORA_BENCH_LEAVE_FILE")
# the reset that a new process joining brings (after the kill's, if any)
JOIN_RESET = 1 if grow_file else 2
BATCH = 32
torch.manual_seed(0)
device = torch.device("cpu")
if os.environ.get("HORA_BENCH_CUDA") == "1":
    device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                            torch.nn.Linear(256, 1)).to(device)
sharding = os.environ.get("HORA_BENCH_SHARDING")
if sharding:  # Adam: an optimizer state to shard
    optimizer = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.001),
                                         named_parameters=model.named_parameters(),
                                         sharding=sharding)
else:
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                         named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0, samples=0)
last_commit = [0.0]
commit_seconds: list[float] = []


def on_reset():
    resets[0] += 1
    if launch == 0 and hvd.rank() == 0:
        if leave_file and resets[0] == 1:  # the last rank left at the last commit
            event("leave_commit", last_commit[0])
        elif resets[0] == JOIN_RESET:  # the new process joined at the last commit
            event("grow_commit", last_commit[0])
        elif resets[0] == 1:
            event("reset")


state.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state):
    recovering = launch > 0 or resets[0] > 0 or joiner
    if launch > 0 and hvd.rank() == 0:
        event("restored")
    first = True
    while deadline or state.step < steps:
        if deadline and hvd.broadcast_object(time.time() > deadline, name="bench.deadline"):
            break
        if (not deadline and launch == 0 and resets[0] == 0 and not joiner
                and state.step == kill_step):
            if grow_file and hvd.rank() == 0:
                with open(grow_file, "w") as hosts:
                    hosts.write(f"localhost:{hvd.size() + 1}\n")
                event("slots_added")
            elif leave_file and hvd.rank() == 0:
                with open(leave_file, "w") as hosts:
                    hosts.write(f"localhost:{hvd.size() - 1}\n")
                event("slots_removed")
            elif not grow_file and not leave_file and hvd.rank() == victim:
                event("killed")
                os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(step_sleep)
        x = torch.randn(BATCH, 64, device=device)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        if first and recovering and (hvd.rank() == 0 or joiner):
            name = "joiner_first_step" if joiner else (
                "left_first_step" if leave_file and launch == 0 else
                "grown_first_step" if resets[0] == JOIN_RESET else "first_step")
            event(name)
        first = False
        state.step += 1
        state.samples += BATCH * hvd.size()
        if state.step % 10 == 0:
            last_commit[0] = time.time()
            state.commit()
            commit_seconds.append(time.time() - last_commit[0])


train(state)
if hvd.rank() == 0 and commit_seconds:
    event("commit_mean", sum(commit_seconds) / len(commit_seconds))
if deadline and hvd.rank() == 0:
    print(f"bench-elastic-samples {state.samples} {hvd.size()}", flush=True)
