"""Elastic, fault-tolerant training of a small CNN on handwritten digits:
Horovod's elastic API with hora.torch. Kill any rank (or all of them) and
the job resumes from its last commit; add slots and it grows.

Run with fault tolerance on this machine (2 ranks, at least 1):
    horarun -np 2 --min-np 1 python examples/pytorch/elastic_train_digits.py
Kill a rank while it trains (kill -9 <pid>): horarun launches the next world
and training continues from the last commit. With a discovery script that
prints "localhost:<slots>" lines, the world follows the slots it lists:
    horarun -np 1 --min-np 1 --max-np 2 --host-discovery-script ./hosts.sh \\
        python examples/pytorch/elastic_train_digits.py
See docs/elastic.md.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

import hora.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import DigitNet, evaluate, load_digits_dataset  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--base-lr", type=float, default=0.05, help="per rank")
    parser.add_argument("--commit-every", type=int, default=5, help="batches between commits")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="sleep per batch, to leave time to kill a rank")
    args = parser.parse_args()

    hvd.init()
    torch.manual_seed(0)
    train_x, train_y, test_x, test_y, source = load_digits_dataset()
    dataset = torch.utils.data.TensorDataset(train_x, train_y)
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    model = DigitNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler,
                                   epoch=0, batch=0)

    def on_reset():
        # The global batch follows the number of ranks, and so does the rate.
        for group in optimizer.param_groups:
            group["lr"] = args.base_lr * hvd.size()
        if hvd.rank() == 0:
            print(f"new world: {hvd.size()} rank(s), from epoch {state.epoch} "
                  f"batch {state.batch}", flush=True)

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state):
        if hvd.rank() == 0:
            print(f"training on {source} with {hvd.size()} rank(s)", flush=True)
        while state.epoch < args.epochs:
            started = time.time()
            for batch, (images, labels) in enumerate(loader, start=state.batch):
                state.batch = batch
                optimizer.zero_grad()
                loss = F.cross_entropy(model(images), labels)
                loss.backward()
                optimizer.step()
                sampler.record_batch(state.batch, args.batch_size)
                time.sleep(args.step_seconds)
                if (state.batch + 1) % args.commit_every == 0:
                    state.batch += 1
                    state.commit()
            accuracy = evaluate(model, test_x, test_y)
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {loss.item():.3f}, test accuracy "
                      f"{accuracy:.3f} ({time.time() - started:.1f} s)", flush=True)
            state.epoch += 1
            state.batch = 0
            sampler.set_epoch(state.epoch)
            state.commit()
        return evaluate(model, test_x, test_y)

    accuracy = train(state)
    if hvd.rank() == 0:
        print(f"final test accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
