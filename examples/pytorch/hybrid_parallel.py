"""Hybrid parallelism with process sets: a model split into 2 pipeline
stages (model parallelism) times 2 data-parallel replicas, on 4 ranks.

    rank:     0          1          2          3
    stage:    0 (first)  1 (second) 0          1
    replica:  0          0          1          1

Stage 0 turns a batch into hidden activations and hands them to the stage-1
rank of its replica (a broadcast inside the replica's process set); stage 1
computes the loss and hands the activations' gradient back the same way.
Each stage's gradients are averaged only among the replicas of that stage
(DistributedOptimizer(process_set=...)): ranks {0, 2} for stage 0 and
{1, 3} for stage 1. At the end every rank checks that its stage's weights
equal those of a single process training the whole model on the global
batch (both replicas' batches together).

Run on this machine:
    horarun -np 4 python examples/pytorch/hybrid_parallel.py
"""

import argparse
import sys

import torch
import torch.nn.functional as F

import hora.torch as hvd

FEATURES, HIDDEN, CLASSES = 16, 32, 4


def make_stages(seed=0):
    torch.manual_seed(seed)
    first = torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh())
    second = torch.nn.Linear(HIDDEN, CLASSES)
    return first, second


def batch(step, replica, batch_size):
    """Replica `replica`'s batch at `step`: the labels come from a fixed
    random teacher, so the task is learnable."""
    g = torch.Generator().manual_seed(1000 * step + replica)
    x = torch.randn(batch_size, FEATURES, generator=g)
    teacher = torch.Generator().manual_seed(7)
    w = torch.randn(FEATURES, CLASSES, generator=teacher)
    return x, (x @ w).argmax(dim=1)


def reference(steps, batch_size, lr, replicas):
    """The same training in one process on the global batch."""
    first, second = make_stages()
    params = list(first.parameters()) + list(second.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=0.9)
    for step in range(steps):
        xs, ys = zip(*(batch(step, r, batch_size) for r in range(replicas)))
        loss = F.cross_entropy(second(first(torch.cat(xs))), torch.cat(ys))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return first, second


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=32, help="per replica")
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    hvd.init(process_sets="dynamic")
    if hvd.size() != 4:
        if hvd.rank() == 0:
            print(f"hybrid_parallel.py runs on 4 ranks (2 stages x 2 replicas), got {hvd.size()}",
                  file=sys.stderr)
        return 2
    rank = hvd.rank()
    stage, replica = rank % 2, rank // 2
    # Every rank adds every set, in the same order.
    stage_sets = [hvd.add_process_set([0, 2]), hvd.add_process_set([1, 3])]
    replica_sets = [hvd.add_process_set([0, 1]), hvd.add_process_set([2, 3])]
    my_stage, my_replica = stage_sets[stage], replica_sets[replica]
    first_rank, second_rank = my_replica.ranks  # global ranks of this replica's stages

    first, second = make_stages()  # same seed everywhere: replicas start equal
    module = first if stage == 0 else second
    opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=module.named_parameters(),
                                   process_set=my_stage)

    hidden = torch.zeros(args.batch_size, HIDDEN)
    for step in range(args.steps):
        x, y = batch(step, replica, args.batch_size)
        opt.zero_grad()
        if stage == 0:
            h = module(x)
            hidden = hvd.broadcast(h.detach(), first_rank, name="hidden", process_set=my_replica)
            grad_h = hvd.broadcast(torch.zeros_like(h), second_rank, name="grad_hidden",
                                   process_set=my_replica)
            h.backward(grad_h)
        else:
            hidden = hvd.broadcast(hidden, first_rank, name="hidden", process_set=my_replica)
            h = hidden.clone().requires_grad_(True)
            loss = F.cross_entropy(module(h), y)
            loss.backward()
            hvd.broadcast(h.grad, second_rank, name="grad_hidden", process_set=my_replica)
            # The loss of each replica's batch, averaged over the replicas.
            mean = hvd.allreduce(loss.detach(), name="loss", process_set=my_stage)
            if rank == 1 and (step % 50 == 0 or step == args.steps - 1):
                print(f"step {step:4d}  loss {mean.item():.4f}", flush=True)
        opt.step()

    # Check against the single-process run of the whole model.
    want_first, want_second = reference(args.steps, args.batch_size, args.lr, replicas=2)
    want = want_first if stage == 0 else want_second
    diff = max((p - q).abs().max().item()
               for p, q in zip(module.parameters(), want.parameters()))
    diffs = hvd.allgather_object(diff)
    if rank == 0:
        print(f"largest difference from single-process training, per rank: "
              f"{', '.join(f'{d:.2e}' for d in diffs)}", flush=True)
    ok = max(diffs) < 1e-4
    if rank == 0:
        print("hybrid training matches single-process training" if ok else
              "hybrid training DIFFERS from single-process training", flush=True)
    hvd.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
