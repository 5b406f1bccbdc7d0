"""hora.torch used the way Horovod's PyTorch examples use horovod.torch
(pytorch_mnist.py, pytorch_synthetic_benchmark.py,
pytorch_imagenet_resnet50.py): the same calls in the same order, with
every result compared against what one process computes from all ranks'
data. Each rank builds that reference itself from the deterministic
per-rank inputs."""

import os
import tempfile
import warnings
import zlib

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402
from torch.utils.data.distributed import DistributedSampler  # noqa: E402

import hora.torch as hvd  # noqa: E402
from torch_helpers import float_input  # noqa: E402


class Net(nn.Module):
    """The layout of Horovod's MNIST network (two convolutions with max
    pooling, two linear layers, log-softmax) at a smaller size and without
    dropout, so that a single process can follow it exactly."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3)
        self.conv2 = nn.Conv2d(4, 6, kernel_size=3)
        self.fc1 = nn.Linear(6, 12)
        self.fc2 = nn.Linear(12, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        return F.log_softmax(self.fc2(x), dim=1)


def conv_net(norm_layer):
    """A small CNN whose normalization layer is chosen the way torchvision's
    models take ``norm_layer`` (called with the number of channels), as the
    synthetic benchmark passes ``hvd.SyncBatchNorm``."""
    return nn.Sequential(nn.Conv2d(3, 5, 3, padding=1, bias=False), norm_layer(5), nn.ReLU(),
                         nn.Conv2d(5, 4, 3, stride=2, bias=False), norm_layer(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 7))


def labels(tag, rank, rows, classes=10):
    generator = torch.Generator().manual_seed(zlib.crc32(f"{tag}.y/{rank}".encode()))
    return torch.randint(0, classes, (rows,), generator=generator)


def digits_batch(tag, rank, rows=5):
    return float_input(f"{tag}.x", rank, (rows, 1, 10, 10), torch.float32), labels(tag, rank, rows)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def global_batch_backward(reference, tag, size):
    """Gradients one process would get from every rank's batch of ``tag``."""
    batches = [digits_batch(tag, r) for r in range(size)]
    (sum(F.nll_loss(reference(x), y) for x, y in batches) / size).backward()


def assert_on_every_rank(condition, message):
    """Asserts ``condition`` on all ranks together: every rank fails when any
    does, so that none is left waiting in a collective the others skipped."""
    flags = hvd.allgather(torch.tensor([int(bool(condition))]), name="horovod_style.agree")
    failing = [r for r, ok in enumerate(flags.tolist()) if not ok]
    assert not failing, f"{message} on rank(s) {failing}"


def assert_identical_on_every_rank(tensor):
    rows = hvd.allgather(tensor.unsqueeze(0), name="horovod_style.identical")
    for r in range(1, rows.shape[0]):
        assert torch.equal(rows[0], rows[r]), f"rank {r} differs from rank 0"


def assert_moved_and_close(model, reference, start, atol):
    """``model`` matches ``reference``, and the reference moved far beyond
    ``atol`` from ``start`` (so a missing or wrong reduction would show)."""
    moved = (flat(reference) - start).abs().max()
    assert moved > 20 * atol, f"the reference barely moved ({moved:.2e}); the check is too weak"
    difference = (flat(model) - flat(reference)).abs().max()
    assert_on_every_rank(difference <= atol,
                         f"differs from one process on all data by {difference:.2e}")


def metric_average(val, name):
    """pytorch_mnist.py's helper, as written there (torch warns about
    torch.tensor(tensor); that is the script's business)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def test_preamble_and_queries(rank, size):
    hvd.init()  # scripts call it; again while running it keeps the job as it is
    assert hvd.is_initialized() and hvd.rank() == rank and hvd.size() == size
    assert 0 <= hvd.local_rank() < hvd.local_size() <= size
    # the scripts branch on these (`if args.use_adasum and hvd.nccl_built():`)
    assert hvd.nccl_built() is hvd.build_info()["nccl_built"]
    assert hvd.mpi_threads_supported() is True
    ranks = hvd.allgather(torch.tensor([rank, hvd.local_rank()]).unsqueeze(0),
                          name="horovod_style.ranks")
    assert ranks[:, 0].tolist() == list(range(size))
    hosts = size // hvd.local_size()
    assert sorted(ranks[:, 1].tolist()) == sorted(list(range(hvd.local_size())) * hosts)


@pytest.mark.parametrize("items", [24, 23])
def test_distributed_sampler_gives_every_item_to_one_rank(items, rank, size):
    dataset = TensorDataset(torch.arange(items))
    sampler = DistributedSampler(dataset, num_replicas=hvd.size(), rank=hvd.rank())
    sampler.set_epoch(3)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler)
    mine = torch.cat([batch for (batch,) in loader])
    per_rank = -(-items // size)
    assert len(sampler) == per_rank == len(mine)
    everyone = hvd.allgather(mine, name=f"horovod_style.sampler.{items}")
    counts = torch.bincount(everyone, minlength=items)
    assert (counts >= 1).all(), "some items went to no rank"
    assert int(counts.sum()) == per_rank * size
    assert int((counts - 1).sum()) == per_rank * size - items  # only the padding repeats


@pytest.mark.parametrize("compression,predivide", [
    ("none", 1.0), ("none", 4.0), ("fp16", 1.0), ("fp16", 2.0)])
def test_mnist_script_flow_trains_like_one_process(compression, predivide, rank, size):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # "limit # of CPU threads to be used per worker"
    try:
        torch.manual_seed(100 + rank)  # every rank starts elsewhere; the broadcast fixes it
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.2 * size, momentum=0.5)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=getattr(hvd.Compression, compression), op=hvd.Average,
            gradient_predivide_factor=predivide)

        torch.manual_seed(100)
        reference = Net()
        assert_on_every_rank(torch.equal(flat(model), flat(reference)),
                             "the weights are not rank 0's initial ones")
        start = flat(reference)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.2 * size,
                                              momentum=0.5)
        tag = f"mnist.{compression}.{predivide}"
        for step in range(3):
            optimizer.zero_grad()
            data, target = digits_batch(f"{tag}.{step}", rank)
            F.nll_loss(model(data), target).backward()
            optimizer.step()

            reference_optimizer.zero_grad()
            global_batch_backward(reference, f"{tag}.{step}", size)
            reference_optimizer.step()
            if compression == "fp16" and size > 1:  # (one rank reduces nothing)
                for p in model.parameters():  # the averaged gradient travelled as float16
                    assert torch.equal(p.grad, p.grad.half().float())
    finally:
        torch.set_num_threads(threads)
    assert_identical_on_every_rank(flat(model))
    assert_moved_and_close(model, reference, start, 1e-5 if compression == "none" else 2e-3)


def test_mnist_metric_average(rank, size):
    test_loss = 0.5 + rank  # a Python float, as the script's test() produces
    test_accuracy = torch.tensor(float(rank + 1)).sum() / (rank + 2)  # a 0-d tensor
    assert metric_average(test_loss, "avg_loss") == pytest.approx(0.5 + (size - 1) / 2)
    expected = sum((r + 1) / (r + 2) for r in range(size)) / size
    assert metric_average(test_accuracy, "avg_accuracy") == pytest.approx(expected, rel=1e-6)


def test_mixed_precision_pattern_synchronize_unscale_skip(rank, size):
    """pytorch_mnist.py's AMP loop without CUDA: backward on a scaled loss,
    optimizer.synchronize(), unscale the gradients in place, then step inside
    skip_synchronize()."""
    torch.manual_seed(7)
    model = Net()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    torch.manual_seed(7)
    reference = Net()
    start = flat(reference)
    scale = 1024.0
    data, target = digits_batch("amp", rank)
    optimizer.zero_grad()
    (F.nll_loss(model(data), target) * scale).backward()
    optimizer.synchronize()
    for p in model.parameters():
        p.grad.div_(scale)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a second reduction would warn
        with optimizer.skip_synchronize():
            optimizer.step()

    global_batch_backward(reference, "amp", size)
    torch.optim.SGD(reference.parameters(), lr=0.1).step()
    assert_identical_on_every_rank(flat(model))
    assert_moved_and_close(model, reference, start, 1e-5)


@pytest.mark.parametrize("compression", ["none", "fp16"])
def test_synthetic_benchmark_flow_with_sync_batch_norm(compression, rank, size):
    """pytorch_synthetic_benchmark.py: norm_layer=hvd.SyncBatchNorm, SGD at
    0.01 x size, broadcast, a fixed random batch per rank. With the same
    batch size on every rank that is one large batch through BatchNorm2d."""
    torch.manual_seed(11 + rank)
    model = conv_net(hvd.SyncBatchNorm)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05 * size)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=getattr(hvd.Compression, compression),
                                         op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    torch.manual_seed(11)
    reference = conv_net(nn.BatchNorm2d)
    start = flat(reference)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.05 * size)

    def batch(r):
        return (float_input("synthetic.x", r, (3, 3, 6, 6), torch.float32) + r,
                labels("synthetic", r, 3, classes=7))

    data, target = batch(rank)
    everything = [batch(r) for r in range(size)]
    global_data = torch.cat([x for x, _ in everything])
    global_target = torch.cat([y for _, y in everything])
    for _ in range(4):
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()
        reference_optimizer.zero_grad()
        F.cross_entropy(reference(global_data), global_target).backward()
        reference_optimizer.step()
    assert_identical_on_every_rank(flat(model))
    assert_moved_and_close(model, reference, start, 1e-4 if compression == "none" else 3e-3)
    for mine, expected in zip(model.modules(), reference.modules()):
        if isinstance(expected, nn.BatchNorm2d):
            assert torch.allclose(mine.running_mean, expected.running_mean, atol=1e-4)
            assert torch.allclose(mine.running_var, expected.running_var, atol=1e-4)


def test_imagenet_script_accumulation_metrics_and_resume(rank, size):
    """pytorch_imagenet_resnet50.py: two sub-batches per allreduce
    (backward_passes_per_step), the learning rate set through param_groups,
    Metric's repeated allreduce under one name, the resume epoch broadcast
    as a tensor, and a checkpoint written by rank 0 and restored through
    broadcast_parameters / broadcast_optimizer_state."""
    passes, base_lr = 2, 0.05

    def build(seed):
        torch.manual_seed(seed)
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=base_lr, momentum=0.9,
                                    weight_decay=1e-3)
        return model, optimizer

    model, optimizer = build(20 + rank)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, op=hvd.Average)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    reference, reference_optimizer = build(20)
    start = flat(reference)

    def step(epoch, distributed):
        lr = base_lr * size * passes * (0.5 if epoch else 1.0)
        target_model, target_optimizer = ((model, optimizer) if distributed
                                          else (reference, reference_optimizer))
        for group in target_optimizer.param_groups:
            group["lr"] = lr
        target_optimizer.zero_grad()
        ranks = [rank] if distributed else range(size)
        total = 0.0
        for r in ranks:
            data, target = digits_batch(f"imagenet.{epoch}", r, rows=6)
            for i in range(0, 6, 3):
                loss = F.nll_loss(target_model(data[i:i + 3]), target[i:i + 3])
                if distributed:
                    loss = loss / passes
                else:
                    loss = loss / (passes * size)
                loss.backward()
                total += float(loss.detach())
        target_optimizer.step()
        return total

    # Metric: the sum of allreduce(value, name=...) over updates, then / n
    metric_sum, reference_sum = torch.tensor(0.), 0.0
    for epoch in range(2):
        loss = step(epoch, True)
        reference_sum += step(epoch, False)
        metric_sum += hvd.allreduce(torch.tensor(loss), name="train_loss")
    assert float(metric_sum / 2) == pytest.approx(reference_sum / 2, rel=1e-5)
    assert_identical_on_every_rank(flat(model))
    assert_moved_and_close(model, reference, start, 1e-5)

    trained = flat(model)
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]
    # rank 0's own directory (pytest's tmp_path is shared by the ranks' sessions)
    directory = tempfile.TemporaryDirectory() if rank == 0 else None
    checkpoint = os.path.join(directory.name, "checkpoint.pt") if directory else None
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()},
                   checkpoint)
    resume_from_epoch = 2 if rank == 0 else 0
    resume_from_epoch = hvd.broadcast(torch.tensor(resume_from_epoch), root_rank=0,
                                      name="resume_from_epoch").item()
    assert resume_from_epoch == 2

    # a restarted job: fresh weights everywhere, rank 0 restores the checkpoint
    model, optimizer = build(50 + rank)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         backward_passes_per_step=passes, op=hvd.Average)
    if rank == 0:
        saved = torch.load(checkpoint)
        directory.cleanup()
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    assert_on_every_rank(torch.equal(flat(model), trained), "the restored weights differ")
    assert_on_every_rank(all(torch.equal(optimizer.state[p]["momentum_buffer"], buffer)
                             for p, buffer in zip(model.parameters(), momentum)),
                         "the restored momentum differs")
    assert_on_every_rank(optimizer.param_groups[0]["lr"] == base_lr * size * passes * 0.5,
                         "the restored learning rate (epoch 1's) differs")
    step(2, True)
    step(2, False)
    assert_identical_on_every_rank(flat(model))
    difference = (flat(model) - flat(reference)).abs().max()
    assert_on_every_rank(difference <= 1e-5, f"after resuming, off by {difference:.2e}")


def test_use_adasum_gives_the_delta_optimizer(rank, size):
    """--use-adasum in the scripts passes op=hvd.Adasum: on a power-of-two
    number of ranks that is Horovod's delta optimizer (the steps, not the
    gradients, are combined), otherwise a clear error instead of silently
    averaging."""
    model = Net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    if size & (size - 1):
        with pytest.raises(ValueError, match="Adasum needs a number of ranks that is a power"):
            hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                     op=hvd.Adasum)
        return
    opt = hvd.DistributedOptimizer(sgd, named_parameters=model.named_parameters(),
                                   op=hvd.Adasum)
    assert isinstance(opt, torch.optim.SGD)
    assert type(opt).__name__ == "SGD"


def test_num_groups_positional_as_in_horovods_signature(rank, size):
    """Horovod's DistributedOptimizer(optimizer, named_parameters,
    compression, backward_passes_per_step, op, gradient_predivide_factor,
    num_groups, groups, ...): the older num_groups still groups the
    reductions, with a DeprecationWarning."""
    torch.manual_seed(3)
    model = Net()
    with pytest.warns(DeprecationWarning, match="num_groups"):
        optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.3),
                                             model.named_parameters(), hvd.Compression.none,
                                             1, hvd.Average, 1.0, 2)
    assert [len(unit) for unit in optimizer._hora_units] == [4, 4]  # 8 tensors in 2 groups
    torch.manual_seed(3)
    reference = Net()
    start = flat(reference)
    data, target = digits_batch("num_groups", rank)
    F.nll_loss(model(data), target).backward()
    optimizer.step()
    global_batch_backward(reference, "num_groups", size)
    torch.optim.SGD(reference.parameters(), lr=0.3).step()
    assert_identical_on_every_rank(flat(model))
    assert_moved_and_close(model, reference, start, 1e-5)
