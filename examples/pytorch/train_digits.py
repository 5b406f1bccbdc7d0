"""Data-parallel training of a small CNN on handwritten digits with hora.torch.

Run on two ranks:  horarun -np 2 python examples/pytorch/train_digits.py
(or python -m hora.runner -np 2 ...). Resume after an interruption with the
same --checkpoint path. --cuda trains on GPU local_rank (ranks share the GPUs
in turn when there are fewer GPUs than ranks); --fp16-allreduce sends the
gradients as float16; --powersgd-rank R compresses them with PowerSGD,
--onebit to their signs; --local-steps H averages the parameters every H
steps instead (local SGD).

The data are scikit-learn's bundled 8x8 digits (1797 images, nothing to
download; pip install scikit-learn). Without scikit-learn the script falls
back to synthetic 8x8 patterns so it still runs, but the accuracies then
mean little. Each rank trains on its shard of the training set (a
DistributedSampler), gradients are averaged by hvd.DistributedOptimizer,
the learning rate scales with the number of ranks as the global batch does,
and rank 0 prints progress and writes the checkpoint.
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import hora.torch as hvd


def load_digits_dataset():
    """(train_x, train_y, test_x, test_y, source): images as (N, 1, 8, 8)
    floats in [0, 1]; a fixed 80/20 split, the same on every rank."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        load_digits = None
    if load_digits is not None:
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32) / 16.0
        labels = torch.tensor(digits.target, dtype=torch.int64)
        source = "scikit-learn digits"
    else:
        generator = torch.Generator().manual_seed(0)
        prototypes = (torch.rand(10, 8, 8, generator=generator) > 0.6).float()
        labels = torch.randint(0, 10, (1797,), generator=generator)
        noise = torch.rand(1797, 8, 8, generator=generator)
        images = (prototypes[labels] * 0.7 + noise * 0.3).clamp(0, 1)
        source = "synthetic patterns (scikit-learn is not installed)"
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(42))
    images, labels = images[order].unsqueeze(1), labels[order]
    cut = int(0.8 * len(labels))
    return images[:cut], labels[:cut], images[cut:], labels[cut:], source


class DigitNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        # batch statistics over every rank's batch, as one large batch would give
        self.norm1 = hvd.SyncBatchNorm(16)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.norm1(self.conv1(x)))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def evaluate(model, images, labels, device="cpu"):
    """Accuracy over the whole set; each rank scores every size()-th image."""
    model.eval()
    with torch.no_grad():
        mine = slice(hvd.rank(), None, hvd.size())
        correct = (model(images[mine].to(device)).argmax(1) == labels[mine].to(device)).sum()
    counts = hvd.allreduce(torch.tensor([float(correct), float(len(labels[mine]))]),
                           op=hvd.Sum, name="eval.counts")
    model.train()
    return float(counts[0] / counts[1])


def save_checkpoint(path, model, optimizer, epoch):
    partial = path + ".partial"
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch}, partial)
    os.replace(partial, path)  # never leave a half-written checkpoint behind


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.02, help="for one rank; scaled by size()")
    parser.add_argument("--checkpoint", default=None,
                        help="file written by rank 0 after every epoch; resumed from if present")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cuda", action="store_true",
                        help="train on GPU local_rank (modulo the GPUs there are)")
    parser.add_argument("--fp16-allreduce", action="store_true",
                        help="send gradients as float16 (hvd.Compression.fp16)")
    parser.add_argument("--powersgd-rank", type=int, default=0,
                        help="compress gradients with hvd.Compression.powersgd(rank=R) after "
                             "--powersgd-start uncompressed steps (0: off)")
    parser.add_argument("--powersgd-start", type=int, default=10,
                        help="uncompressed steps before PowerSGD or --onebit starts")
    parser.add_argument("--onebit", action="store_true",
                        help="compress gradients to their signs and a scale "
                             "(hvd.Compression.onebit) after --powersgd-start steps")
    parser.add_argument("--local-steps", type=int, default=1,
                        help="local SGD: average the parameters every H steps instead of the "
                             "gradients every step (1: off)")
    args = parser.parse_args()
    if sum([args.fp16_allreduce, args.powersgd_rank > 0, args.onebit, args.local_steps > 1]) > 1:
        parser.error("choose one of --fp16-allreduce, --powersgd-rank, --onebit and "
                     "--local-steps")

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    device = torch.device("cpu")
    if args.cuda:
        if not torch.cuda.is_available():
            parser.error("--cuda: PyTorch sees no GPU")
        device = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed + rank)  # differing initial weights: the broadcast fixes them

    train_x, train_y, test_x, test_y, source = load_digits_dataset()
    sampler = DistributedSampler(TensorDataset(train_x, train_y), num_replicas=size, rank=rank,
                                 shuffle=True, seed=args.seed)
    loader = DataLoader(TensorDataset(train_x, train_y), batch_size=args.batch_size,
                        sampler=sampler)

    model = DigitNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    if args.powersgd_rank:
        compression = hvd.Compression.powersgd(rank=args.powersgd_rank,
                                               start_iter=args.powersgd_start)
    if args.onebit:
        compression = hvd.Compression.onebit(start_iter=args.powersgd_start)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, local_steps=args.local_steps)

    first_epoch = 0
    if rank == 0 and args.checkpoint and os.path.exists(args.checkpoint):
        saved = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        # the saved learning rate was scaled for the saving job's size; this
        # job may run on a different number of ranks
        for group in optimizer.param_groups:
            group["lr"] = args.lr * size
        first_epoch = saved["epoch"] + 1
        print(f"resuming from {args.checkpoint} after epoch {first_epoch}", flush=True)
    first_epoch = hvd.broadcast_object(first_epoch, root_rank=0, name="first_epoch")
    # every rank starts from rank 0's weights, momentum and learning rate
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    if rank == 0:
        print(f"{source}: {len(train_y)} training / {len(test_y)} test images, {size} rank(s), "
              f"global batch {args.batch_size * size}, on {device}", flush=True)
    start = time.time()
    for epoch in range(first_epoch, args.epochs):
        sampler.set_epoch(epoch)
        total_loss = torch.zeros(2)
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            total_loss += torch.tensor([loss.item() * len(labels), len(labels)])
        total_loss = hvd.allreduce(total_loss, op=hvd.Sum, name="train.loss")
        accuracy = evaluate(model, test_x, test_y, device)
        if rank == 0:
            print(f"epoch {epoch + 1:3d}  loss {float(total_loss[0] / total_loss[1]):.4f}  "
                  f"test accuracy {accuracy:.4f}  ({time.time() - start:.1f}s)", flush=True)
            if args.checkpoint:
                save_checkpoint(args.checkpoint, model, optimizer, epoch)

    accuracy = evaluate(model, test_x, test_y, device)
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    spread = (hvd.allreduce(weights, op=hvd.Max, name="check.max")
              - hvd.allreduce(weights, op=hvd.Min, name="check.min")).abs().max()
    if rank == 0:
        print(f"trained on {size} rank(s); final test accuracy {accuracy:.4f}; "
              f"weight spread across ranks {float(spread):.1e}", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
