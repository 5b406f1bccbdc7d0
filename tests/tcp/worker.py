"""A process of a job over hora's TCP transport, started by
tests/test_tcp_transport.py without MPI: it allreduces for TCP_STEPS steps
and, when a peer is lost, forms the next world in place with the other
survivors (``hora._C.reform``, as ``hvd.elastic.run`` does) and redoes the
step. TCP_FAULTS="<process id>:<kill|stop>@<step>,..." makes processes
SIGKILL or SIGSTOP themselves; "<process id>:leave@<step>" makes that
process leave the job at that step, every process calling
``hora._C.exclude`` together (as ``hvd.elastic.run`` does when its host is
removed). Prints one JSON line per event."""

import json
import os
import signal
import time

import numpy as np

import hora
from hora import _C

me = int(os.environ["HORA_PROCESS_ID"])
faults = {}
leaving = {}  # step -> the process ids that leave then
for item in filter(None, os.environ.get("TCP_FAULTS", "").split(",")):
    who, _, what = item.partition(":")
    kind, _, step = what.partition("@")
    if kind == "leave":
        leaving.setdefault(int(step), []).append(int(who))
    elif int(who) == me:
        faults[int(step)] = kind


def say(event, **fields):
    print(json.dumps(dict(event=event, id=me, pid=os.getpid(), rank=hora.rank(),
                          size=hora.size(), **fields)), flush=True)


hora.init()
say("init")
step = 0
steps = int(os.environ.get("TCP_STEPS", "8"))
while step < steps:
    kind = faults.pop(step, None)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if step in leaving:
        ids = hora.allgather(np.array([me], dtype=np.int64), name=f"leavers.{step}").tolist()
        going = leaving.pop(step)
        ranks = [r for r, i in enumerate(ids) if i in going]
        began = time.monotonic()
        left, seconds = _C.exclude(ranks)
        if left:
            # (no rank or size to print: this process is in no world now)
            print(json.dumps({"event": "left", "id": me, "pid": os.getpid()}), flush=True)
            raise SystemExit(0)
        say("excluded", seconds=time.monotonic() - began, leaving=ranks)
    try:
        ids = hora.allgather(np.array([me], dtype=np.int64), name=f"ids.{step}")
        total = hora.allreduce(np.full(100_000, me + 1, dtype=np.float32), op=hora.Sum,
                               name=f"sum.{step}")
    except hora.HoraError as error:
        began = time.monotonic()
        _C.reform()
        # every survivor redoes the step rank 0 is at
        step = int(hora.broadcast(np.array([step], dtype=np.int64), root_rank=0,
                                  name="step")[0])
        say("reformed", seconds=time.monotonic() - began, error=str(error))
        continue
    if not np.all(total == float(np.sum(ids + 1))):
        say("wrong", got=float(total[0]), ids=ids.tolist())
        raise SystemExit(3)
    step += 1
say("done", ids=sorted(ids.tolist()))
