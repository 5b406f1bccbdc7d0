"""SyncBatchNorm against torch.nn.BatchNorm on the concatenation of every
rank's batch, forward and backward, with a different batch size on each
rank (rank 0's is empty when there are several ranks)."""

import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from torch_helpers import float_input  # noqa: E402

CHANNELS = 3
LAYOUTS = {"1d": (torch.nn.BatchNorm1d, ()), "1d_length": (torch.nn.BatchNorm1d, (4,)),
           "2d": (torch.nn.BatchNorm2d, (2, 3)), "3d": (torch.nn.BatchNorm3d, (2, 1, 2))}


def rows_of(rank, size):
    return 0 if size > 1 and rank == 0 else rank + 2


def local_batch(tag, rank, size, spatial, dtype):
    shape = (rows_of(rank, size), CHANNELS) + spatial
    return (float_input(f"{tag}.x", rank, shape, dtype) * 2 + 0.5,
            float_input(f"{tag}.w", rank, shape, dtype))


def settings():
    return {"default": {}, "no_affine": {"affine": False}, "cumulative": {"momentum": None},
            "no_running_stats": {"track_running_stats": False}}


def sum_over_ranks(tensor):
    return hvd.allreduce(tensor, op=hvd.Sum)


@pytest.mark.parametrize("setting", list(settings()))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_matches_batch_norm_on_the_global_batch(layout, setting, rank, size):
    reference_class, spatial = LAYOUTS[layout]
    options = settings()[setting]
    tag = f"torch.sbn.{layout}.{setting}"
    torch.manual_seed(7)
    sync = hvd.SyncBatchNorm(CHANNELS, **options).double()
    reference = reference_class(CHANNELS, **options).double()
    if sync.affine:
        with torch.no_grad():
            for module in (sync, reference):
                module.weight.copy_(torch.linspace(0.5, 1.5, CHANNELS))
                module.bias.copy_(torch.linspace(-1.0, 1.0, CHANNELS))

    outputs, input_grads, param_grads = [], [], []
    for step in range(2):  # the second step sees the updated running statistics
        x, w = local_batch(f"{tag}.{step}", rank, size, spatial, torch.float64)
        x.requires_grad_(True)
        sync.zero_grad()
        y = sync(x)
        (y * w).sum().backward()
        outputs.append(y.detach())
        input_grads.append(x.grad)
        if sync.affine:
            param_grads.append((sum_over_ranks(sync.weight.grad), sum_over_ranks(sync.bias.grad)))
    sync.eval()
    probe = float_input(f"{tag}.eval", rank, (2, CHANNELS) + spatial)
    evaluated = sync(probe)

    start = sum(rows_of(r, size) for r in range(rank))
    rows = rows_of(rank, size)
    for step in range(2):
        parts = [local_batch(f"{tag}.{step}", r, size, spatial, torch.float64)
                 for r in range(size)]
        x = torch.cat([p[0] for p in parts]).requires_grad_(True)
        w = torch.cat([p[1] for p in parts])
        reference.zero_grad()
        y = reference(x)
        (y * w).sum().backward()
        torch.testing.assert_close(outputs[step], y.detach()[start:start + rows])
        torch.testing.assert_close(input_grads[step], x.grad[start:start + rows])
        if sync.affine:
            torch.testing.assert_close(param_grads[step][0], reference.weight.grad)
            torch.testing.assert_close(param_grads[step][1], reference.bias.grad)
    if sync.track_running_stats:
        torch.testing.assert_close(sync.running_mean, reference.running_mean)
        torch.testing.assert_close(sync.running_var, reference.running_var)
        assert int(sync.num_batches_tracked) == 2
        reference.eval()
        torch.testing.assert_close(evaluated, reference(probe))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_low_precision_inputs(dtype, rank, size):
    tag = f"torch.sbn.low.{dtype}"
    sync = hvd.SyncBatchNorm(CHANNELS)
    reference = torch.nn.BatchNorm2d(CHANNELS)
    x, w = local_batch(tag, rank, size, (2, 2), dtype)
    x.requires_grad_(True)
    (sync(x) * w).sum().backward()
    parts = [local_batch(tag, r, size, (2, 2), dtype) for r in range(size)]
    full = torch.cat([p[0] for p in parts]).float().requires_grad_(True)
    y = reference(full)
    (y * torch.cat([p[1] for p in parts]).float()).sum().backward()
    start = sum(rows_of(r, size) for r in range(rank))
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 2e-2}[dtype]
    assert x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.float(), full.grad[start:start + x.shape[0]],
                               rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(sync.running_var, reference.running_var, rtol=tolerance,
                               atol=tolerance)


def test_errors_and_conversion(rank, size):
    sync = hvd.SyncBatchNorm(CHANNELS)
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        sync(torch.ones(CHANNELS))
    with pytest.raises(ValueError, match="CPU"):
        sync(torch.ones(2, CHANNELS, device="meta"))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, CHANNELS, 1), torch.nn.BatchNorm2d(CHANNELS))
    model[1].running_mean.fill_(0.25)
    converted = hvd.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(converted[1], hvd.SyncBatchNorm)
    assert converted[1].weight is model[1].weight
    assert torch.equal(converted[1].running_mean, torch.full((CHANNELS,), 0.25))
