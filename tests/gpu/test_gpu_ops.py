"""hora.torch collectives on CUDA tensors in a one-rank job, against
references computed on the CPU: every op and dtype, scaling, fusion of many
odd-sized tensors, the data-movement collectives, and stream ordering. With a
CUDA build they run through NCCL; without one, through host staging."""
import warnings

import pytest
import torch

import hora.torch as hvd

DEVICE = "cuda"
DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
OPS = [hvd.Sum, hvd.Average, hvd.Min, hvd.Max, hvd.Product]


def ramp(count, dtype):
    if dtype == torch.bool:
        return (torch.arange(count) % 3 == 0).to(DEVICE)
    if dtype == torch.uint8:
        return (torch.arange(count) % 200).to(dtype).to(DEVICE)
    return (torch.arange(count, dtype=torch.float64) % 97 - 40).to(dtype).to(DEVICE)


def same(actual, expected):
    assert actual.device.type == "cuda", actual.device
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.equal(actual.cpu(), expected.cpu()), (actual, expected)


@pytest.fixture(autouse=True)
def quiet_staging():
    # Without a CUDA build the first GPU collective warns once; that is
    # checked on its own below.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_allreduce_every_dtype_and_op(dtype, op):
    if dtype == torch.bool and op == hvd.Average:
        pytest.skip("Average is not defined for bool")
    x = ramp(1001, dtype)
    same(hvd.allreduce(x, op=op, name=f"ar.{dtype}.{op}"), x)
    y = x.clone()
    hvd.allreduce_(y, op=op, name=f"ar_.{dtype}.{op}")
    same(y, x)


@pytest.mark.parametrize("dtype", FLOATS)
def test_pre_and_post_scaling(dtype):
    x = ramp(513, dtype)
    out = hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25,
                        name=f"sc.{dtype}")
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    expected = ((x.cpu().to(compute) * 2.0).to(dtype).to(compute) * 0.25).to(dtype)
    same(out, expected.to(DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int16, torch.int64])
def test_grouped_allreduce_of_odd_sized_views_is_fused(dtype):
    base = ramp(5000, dtype)
    # Views at odd offsets and sizes: the packing kernel's unaligned paths.
    tensors = [base[1 + 13 * k: 1 + 13 * k + 3 + k] for k in range(120)] + [ramp(0, dtype)]
    outputs = hvd.grouped_allreduce(tensors, op=hvd.Sum, name=f"grouped.{dtype}")
    for x, out in zip(tensors, outputs):
        same(out, x)
    outputs = hvd.grouped_allreduce(tensors, op=hvd.Average, name=f"grouped.avg.{dtype}")
    for x, out in zip(tensors, outputs):
        same(out, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_grouped_allreduce_in_place_is_packed_and_written_back(dtype):
    # one dtype on one device: flattened into one tensor with every member's
    # shape in the request, reduced, and copied back (a transposed member too)
    tensors = [ramp(12, dtype).reshape(3, 4), ramp(7, dtype), ramp(6, dtype).reshape(2, 3).t(),
               ramp(1, dtype).reshape(())]
    expected = [t.clone() for t in tensors]
    pointers = [t.data_ptr() for t in tensors]
    results = hvd.grouped_allreduce_(tensors, op=hvd.Sum, name=f"grouped_.{dtype}")
    assert all(r is t for r, t in zip(results, tensors))
    assert [t.data_ptr() for t in tensors] == pointers
    for t, e in zip(tensors, expected):
        same(t, e)
    # what runs after on the stream sees the results
    doubled = [t * 2 for t in hvd.grouped_allreduce(tensors, op=hvd.Sum, name=f"g2.{dtype}")]
    for d, e in zip(doubled, expected):
        same(d, e * 2)


def test_many_async_allreduces_complete_in_order():
    xs = [ramp(100 + k, torch.float32) * (k + 1) for k in range(64)]
    handles = [hvd.allreduce_async(x, op=hvd.Sum, name=f"async.{k}") for k, x in enumerate(xs)]
    for x, h in zip(xs, handles):
        same(hvd.synchronize(h), x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_broadcast_alltoall_reducescatter(dtype):
    x = ramp(7 * 5, dtype).reshape(7, 5)
    same(hvd.allgather(x, name=f"ag.{dtype}"), x)
    same(hvd.broadcast(x, 0, name=f"bc.{dtype}"), x)
    y = x.clone()
    hvd.broadcast_(y, 0, name=f"bc_.{dtype}")
    same(y, x)
    out, received = hvd.alltoall(x, splits=torch.tensor([7]), name=f"a2a.{dtype}")
    same(out, x)
    assert received.tolist() == [7]
    if dtype != torch.bool:
        same(hvd.reducescatter(x, op=hvd.Sum, name=f"rs.{dtype}"), x)


def test_empty_and_scalar_tensors():
    same(hvd.allreduce(torch.ones((), device=DEVICE), op=hvd.Sum, name="scalar"),
         torch.ones((), device=DEVICE))
    same(hvd.allgather(torch.empty(0, 3, device=DEVICE), name="empty.ag"),
         torch.empty(0, 3, device=DEVICE))


def test_the_collective_waits_for_the_kernel_that_produces_its_input():
    """Would fail if the core read the tensor before the producing kernel
    ran, or if a kernel queued after the collective on the caller's stream
    ran before the result was written."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.zeros(1 << 22, device=DEVICE)
        torch.cuda._sleep(200_000_000)  # ~0.1 s of spinning queued before the fill
        x.fill_(1.0)
        out = hvd.allreduce(x, op=hvd.Sum, name="ordered")
        doubled = out * 2  # queued on the same stream, no synchronization
    torch.cuda.synchronize()
    assert torch.all(doubled == 2.0).item()


def test_output_and_input_on_different_devices_is_a_clear_error():
    from hora._loader import _C
    from hora.common._adapter.submission import KIND_ALLREDUCE, options
    if hvd.cuda_built():
        expected = "the output is in host memory but the input is in GPU 0"
    else:
        expected = "lives on a GPU, but this build of hora has no GPU support"
    with pytest.raises(ValueError, match=expected):
        _C.submit(KIND_ALLREDUCE, [torch.ones(3, device=DEVICE)], ["mixed"], options(),
                  [torch.ones(3)])


def test_in_place_reducescatter_and_allgather_into_an_output_are_for_host_memory():
    """The sharded optimizer's two host-memory shortcuts, refused for GPU
    tensors at submission with the tensor's name (a GPU result always goes
    to a buffer the engine allocates)."""
    if not hvd.cuda_built():
        pytest.skip("without a CUDA build hora.torch stages GPU tensors in Python")
    from hora.torch import _collectives
    x = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="'rs.here'.*an in-place reducescatter runs on host"):
        _collectives.start_reducescatter_in_place(x, "rs.here", hvd.Sum, 1.0, 1.0)
    with pytest.raises(ValueError,
                       match="'ag.into'.*an allgather into a given output runs on host"):
        _collectives.start_allgather_into(x, torch.empty(8, device=DEVICE), "ag.into")


def test_staging_warns_once_without_a_cuda_build():
    if hvd.cuda_built():
        pytest.skip("this build has NCCL; staging is for builds without GPU support")
    import hora.torch._collectives as collectives
    collectives._staging_warned = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hvd.allreduce(torch.ones(3, device=DEVICE), name="staged.1")
        hvd.allreduce(torch.ones(3, device=DEVICE), name="staged.2")
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "HORA_WITH_CUDA=1" in messages[0], messages


def test_collectives_inside_torch_compile_fullgraph():
    # Traced as torch.ops.hora.* nodes: no graph break, and the CUDA stream
    # is taken when the graph runs (it failed on torch.Stream before).
    torch._dynamo.reset()

    def step(t):
        total = hvd.allreduce(t * 2, name="gpu.compile.sum", op=hvd.Sum)
        return hvd.allgather(total, name="gpu.compile.gather").sum()

    x = torch.arange(8, dtype=torch.float32, device=DEVICE)
    got = torch.compile(step, fullgraph=True)(x)
    assert got.device.type == "cuda"
    assert got.item() == step(x).item()


@pytest.mark.parametrize("make", [lambda: hvd.Compression.powersgd(rank=2, start_iter=1),
                                  lambda: hvd.Compression.onebit(start_iter=1, min_elements=16),
                                  None], ids=["powersgd", "onebit", "local_sgd"])
def test_slow_link_methods_train_cuda_parameters_as_on_the_cpu(make):
    # the same model and gradients on the GPU and on the CPU: the stateful
    # compressors and local SGD give the same parameters on both
    results = []
    for device in ("cpu", DEVICE):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(12, 10), torch.nn.Linear(10, 3)).to(device)
        kwargs = {"compression": make()} if make else {"local_steps": 2}
        opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                       named_parameters=net.named_parameters(), **kwargs)
        generator = torch.Generator().manual_seed(1)
        for _ in range(4):
            opt.zero_grad()
            data = torch.randn(6, 12, generator=generator).to(device)
            net(data).square().mean().backward()
            opt.step()
        results.append(torch.cat([p.detach().reshape(-1).cpu() for p in net.parameters()]))
    torch.testing.assert_close(results[1], results[0], rtol=1e-4, atol=1e-5)
