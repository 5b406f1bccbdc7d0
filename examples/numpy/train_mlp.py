"""Data-parallel training of a small neural network with NumPy and hora.

Run on two ranks:  horarun -np 2 python examples/numpy/train_mlp.py

Each rank trains on its own shard of a synthetic two-spirals dataset (made
here, nothing to download). Gradients are averaged across ranks with one
grouped allreduce per step, the initial weights come from rank 0, and rank 0
prints progress. The learning rate scales with the number of ranks, as the
global batch does.
"""

import argparse
import time

import numpy as np

import hora


def make_spirals(samples, seed=0):
    rng = np.random.default_rng(seed)
    t = np.sqrt(rng.uniform(0.05, 1.0, samples)) * 3 * np.pi
    label = rng.integers(0, 2, samples)
    sign = np.where(label == 1, 1.0, -1.0)
    x = np.stack([sign * t * np.cos(t), sign * t * np.sin(t)], axis=1) / (3 * np.pi)
    x += rng.normal(0, 0.02, x.shape)
    return x.astype(np.float32), label.astype(np.int64)


def init_params(rng, hidden):
    def layer(fan_in, fan_out):
        return (rng.normal(0, np.sqrt(2.0 / fan_in), (fan_in, fan_out)).astype(np.float32),
                np.zeros(fan_out, np.float32))
    w1, b1 = layer(2, hidden)
    w2, b2 = layer(hidden, hidden)
    w3, b3 = layer(hidden, 2)
    return [w1, b1, w2, b2, w3, b3]


def forward_backward(params, x, y):
    w1, b1, w2, b2, w3, b3 = params
    h1 = np.maximum(x @ w1 + b1, 0)
    h2 = np.maximum(h1 @ w2 + b2, 0)
    logits = h2 @ w3 + b3
    logits -= logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = -np.log(probs[np.arange(len(y)), y] + 1e-9).mean()
    d = probs
    d[np.arange(len(y)), y] -= 1
    d /= len(y)
    g_w3, g_b3 = h2.T @ d, d.sum(0)
    d = (d @ w3.T) * (h2 > 0)
    g_w2, g_b2 = h1.T @ d, d.sum(0)
    d = (d @ w2.T) * (h1 > 0)
    g_w1, g_b1 = x.T @ d, d.sum(0)
    return loss, [g_w1, g_b1, g_w2, g_b2, g_w3, g_b3]


def accuracy(params, x, y):
    w1, b1, w2, b2, w3, b3 = params
    h = np.maximum(np.maximum(x @ w1 + b1, 0) @ w2 + b2, 0)
    return float(((h @ w3 + b3).argmax(1) == y).mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05, help="for one rank; scaled by size()")
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()

    hora.init()
    rank, size = hora.rank(), hora.size()
    x_all, y_all = make_spirals(4096, seed=0)
    x_test, y_test = make_spirals(1024, seed=1)
    x, y = x_all[rank::size], y_all[rank::size]  # this rank's shard

    params = init_params(np.random.default_rng(1234 + rank), args.hidden)
    for i, p in enumerate(params):  # everyone starts from rank 0's weights
        hora.broadcast_(p, root_rank=0, name=f"init.{i}")
    velocity = [np.zeros_like(p) for p in params]
    lr = args.lr * size
    rng = np.random.default_rng(rank)
    start = time.time()
    for epoch in range(args.epochs):
        order = rng.permutation(len(x))
        steps = len(x) // args.batch_size
        losses = []
        for step in range(steps):
            batch = order[step * args.batch_size:(step + 1) * args.batch_size]
            loss, grads = forward_backward(params, x[batch], y[batch])
            hora.grouped_allreduce_(grads, name="grads", op=hora.Average)
            for p, v, g in zip(params, velocity, grads):
                v *= 0.9
                v += g
                p -= lr * v
            losses.append(loss)
        mean_loss = hora.allreduce(np.array(np.mean(losses), np.float64), name="loss")
        if rank == 0 and (epoch % 5 == 4 or epoch == args.epochs - 1):
            print(f"epoch {epoch + 1:3d}  loss {float(mean_loss):.4f}  "
                  f"test accuracy {accuracy(params, x_test, y_test):.3f}  "
                  f"({time.time() - start:.1f}s)", flush=True)
    # All ranks must hold identical weights after data-parallel training.
    checksum = np.array([sum(float(np.abs(p).sum()) for p in params)])
    spread = hora.allreduce(checksum, name="check.max", op=hora.Max) - \
        hora.allreduce(checksum, name="check.min", op=hora.Min)
    if rank == 0:
        print(f"trained on {size} rank(s); final test accuracy "
              f"{accuracy(params, x_test, y_test):.3f}; weight spread across ranks "
              f"{float(spread[0]):.1e}")
    hora.shutdown()


if __name__ == "__main__":
    main()
