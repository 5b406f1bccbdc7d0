"""Train a small PyTorch network on the digits data set on a Ray cluster with
hora's RayExecutor: the ranks are Ray actors, joined by MPI.

    pip install 'hora[ray,torch,examples]'
    python examples/ray/train_digits_ray.py --num-workers 2

Without --address a local Ray instance is started (ray.init(num_cpus=...)).
"""
import argparse

import ray

from hora.ray import RayExecutor


def train(epochs, batch_size, lr):
    import torch
    from sklearn.datasets import load_digits

    import hora.torch as hvd
    hvd.init()
    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    # the last 300 images are held out; each rank trains on its share of the rest
    train_x, train_y = x[:-300][hvd.rank()::hvd.size()], y[:-300][hvd.rank()::hvd.size()]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    # the same number of steps on every rank
    steps = int(hvd.allreduce(torch.tensor(len(train_x) // batch_size), op=hvd.Min))
    generator = torch.Generator().manual_seed(hvd.rank())
    for epoch in range(epochs):
        order = torch.randperm(len(train_x), generator=generator)
        total = 0.0
        for step in range(steps):
            index = order[step * batch_size:(step + 1) * batch_size]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(train_x[index]), train_y[index])
            loss.backward()
            optimizer.step()
            total += loss.item()
        mean = hvd.allreduce(torch.tensor(total / steps)).item()
        if hvd.rank() == 0:
            print(f"epoch {epoch + 1}/{epochs}: loss {mean:.4f}", flush=True)
    with torch.no_grad():
        accuracy = (model(x[-300:]).argmax(1) == y[-300:]).float().mean().item()
    return hvd.rank(), accuracy


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--cpus-per-worker", type=float, default=1)
    parser.add_argument("--address", default=None, help="an existing Ray cluster")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=max(2, int(args.num_workers * args.cpus_per_worker + 0.5)),
                 include_dashboard=False)
    executor = RayExecutor(RayExecutor.create_settings(timeout_s=120),
                           num_workers=args.num_workers, cpus_per_worker=args.cpus_per_worker)
    executor.start()
    try:
        results = executor.run(train, args=[args.epochs, args.batch_size, 0.05])
    finally:
        executor.shutdown()
    accuracies = {accuracy for _, accuracy in results}
    assert len(accuracies) == 1, f"the ranks ended with different models: {results}"
    print(f"test accuracy: {results[0][1]:.3f} on 300 held-out images, "
          f"{len(results)} ranks agree")
    ray.shutdown()


if __name__ == "__main__":
    main()
