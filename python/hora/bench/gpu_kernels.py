"""python -m hora.bench gpu-kernels: the GPU path's CUDA kernels against a
plain device-to-device copy.

For each total size, on one GPU, times with CUDA events:

- ``memcpy``: one cudaMemcpyAsync of the whole buffer (the reference);
- ``pack``: the batched copy that fills the fusion buffer from --tensors
  separate tensors (one kernel launch per 96 tensors);
- ``unpack+scale``: the batched copy back out, multiplying float32 by 0.5
  (what an Average does after the reduction);
- ``f32->f16``, ``f16->f32``, ``f32->bf16``, ``bf16->f32``: the casts of
  fp16/bf16 compression.

Throughput is (bytes read + bytes written) / time; ``of memcpy`` is that
throughput as a fraction of memcpy's. The launches of each measurement are
captured in a CUDA graph and the graph's replay is timed, so the numbers
are the GPU's time and not the Python loop's (at small sizes a launch from
Python costs more than the kernel); where capture fails the launches are
timed directly, and the header says so. Needs a CUDA build of hora and a
PyTorch that sees a GPU (torch allocates the buffers); no launcher needed.
"""

import argparse
import json

from hora._loader import _C


def build_parser():
    parser = argparse.ArgumentParser(prog="python -m hora.bench gpu-kernels",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--min-bytes", type=int, default=1 << 20,
                        help="smallest total size in bytes (default 1 MiB)")
    parser.add_argument("--max-bytes", type=int, default=256 << 20,
                        help="largest total size in bytes (default 256 MiB)")
    parser.add_argument("--tensors", type=int, default=64,
                        help="tensors the pack and unpack kernels gather or scatter (default 64)")
    parser.add_argument("--iterations", type=int, default=50,
                        help="timed repetitions per kernel and size (default 50)")
    parser.add_argument("--device", type=int, default=0, help="CUDA device index (default 0)")
    parser.add_argument("--json", help="write the results to this file")
    return parser


def _time_ms(torch, stream, launch, iterations):
    """Milliseconds per launch, the launches queued from Python."""
    for _ in range(3):  # warm-up
        launch(stream.cuda_stream)
    start = torch.cuda.Event(enable_timing=True)
    stop = torch.cuda.Event(enable_timing=True)
    start.record(stream)
    for _ in range(iterations):
        launch(stream.cuda_stream)
    stop.record(stream)
    stop.synchronize()
    return start.elapsed_time(stop) / iterations


def _time_graph_ms(torch, stream, launch, iterations):
    """Milliseconds per launch, from the replay of a graph of `iterations`
    launches (the best of three replays)."""
    side = torch.cuda.Stream()
    side.wait_stream(stream)
    with torch.cuda.stream(side):
        launch(side.cuda_stream)  # warm-up outside the capture
    side.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        for _ in range(iterations):
            launch(side.cuda_stream)
    graph.replay()
    torch.cuda.synchronize()
    best = None
    for _ in range(3):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        graph.replay()
        stop.record(stream)
        stop.synchronize()
        ms = start.elapsed_time(stop) / iterations
        best = ms if best is None else min(best, ms)
    return best


def _kernels(codes, size, count, src, dst, half, bf16, pack, unpack):
    """(label, bytes moved, launch(stream)) of each kernel measured at one size."""
    f32, f16, b16 = codes["float32"], codes["float16"], codes["bfloat16"]
    return [
        ("memcpy", 2 * size,
         lambda st: _C.gpu_memcpy(dst.data_ptr(), src.data_ptr(), size, st)),
        ("pack", 2 * size,
         lambda st: _C.gpu_scaled_copy(pack, f32, f32, 1.0, 1, st)),
        ("unpack+scale", 2 * size,
         lambda st: _C.gpu_scaled_copy(unpack, f32, f32, 0.5, 1, st)),
        ("f32->f16", size + size // 2,
         lambda st: _C.gpu_scaled_copy([(src.data_ptr(), half.data_ptr(), count)], f32, f16,
                                    1.0, 1, st)),
        ("f16->f32", size // 2 + size,
         lambda st: _C.gpu_scaled_copy([(half.data_ptr(), dst.data_ptr(), count)], f16, f32,
                                    1.0, 1, st)),
        ("f32->bf16", size + size // 2,
         lambda st: _C.gpu_scaled_copy([(src.data_ptr(), bf16.data_ptr(), count)], f32, b16,
                                    1.0, 1, st)),
        ("bf16->f32", size // 2 + size,
         lambda st: _C.gpu_scaled_copy([(bf16.data_ptr(), dst.data_ptr(), count)], b16, f32,
                                    1.0, 1, st)),
    ]


def run(args):
    import torch

    if not _C.build_info().get("cuda_built"):
        raise SystemExit("gpu-kernels needs a CUDA build of hora: HORA_WITH_CUDA=1 pip install .")
    if not torch.cuda.is_available():
        raise SystemExit("gpu-kernels needs a GPU that PyTorch can see")
    torch.cuda.set_device(args.device)
    stream = torch.cuda.current_stream()
    raw_stream = stream.cuda_stream
    codes = _C.DTYPES
    name = torch.cuda.get_device_name(args.device)
    timer, timing = _time_graph_ms, "graph replay"
    try:
        probe = torch.empty(1024, device="cuda")
        timer(torch, stream, lambda st: _C.gpu_memcpy(probe.data_ptr(), probe.data_ptr() + 2048,
                                                      2048, st), 2)
    except Exception as error:  # capture refused: time the launches as they are queued
        timer, timing = _time_ms, f"launches from Python (graph capture failed: {error})"
    print(f"# hora GPU kernels on {name}; throughput = (read + written) / time; "
          f"pack/unpack over {args.tensors} tensors; timed by {timing}", flush=True)
    print(f"# {'bytes':>11} {'kernel':>14} {'time(us)':>10} {'GB/s':>8} {'of memcpy':>10}",
          flush=True)
    rows = []
    size = args.min_bytes
    while size <= args.max_bytes:
        count = size // 4
        src = torch.rand(count, device="cuda")
        dst = torch.empty_like(src)
        half = torch.empty(count, dtype=torch.float16, device="cuda")
        bf16 = torch.empty(count, dtype=torch.bfloat16, device="cuda")
        # The same bytes as separate tensors (odd sizes, as gradients come).
        piece = max(1, count // args.tensors)
        bounds = [min(count, k * piece + (k % 3)) for k in range(args.tensors)] + [count]
        parts = [src[a:b] for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        offsets = [a for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        pack = [(p.data_ptr(), dst.data_ptr() + 4 * o, p.numel()) for p, o in zip(parts, offsets)]
        unpack = [(dst.data_ptr() + 4 * o, p.data_ptr(), p.numel()) for p, o in zip(parts, offsets)]
        f32 = codes["float32"]
        kernels = _kernels(codes, size, count, src, dst, half, bf16, pack, unpack)
        reference = None
        for label, moved, launch in kernels:
            ms = timer(torch, stream, launch, args.iterations)
            gbps = moved / (ms * 1e-3) / 1e9
            reference = gbps if reference is None else reference
            row = {"bytes": size, "kernel": label, "time_us": ms * 1e3, "gbps": gbps,
                   "of_memcpy": gbps / reference}
            rows.append(row)
            print(f"  {size:>11} {label:>14} {ms * 1e3:>10.1f} {gbps:>8.1f} "
                  f"{gbps / reference:>9.0%}", flush=True)
        # The pack really packs: check it once per size, into a poisoned buffer.
        dst.fill_(float("nan"))
        _C.gpu_scaled_copy(pack, f32, f32, 1.0, 1, raw_stream)
        torch.cuda.synchronize()
        wrong = int((dst[:bounds[-1]] != src[:bounds[-1]]).sum().item())
        if wrong:
            raise SystemExit(f"pack kernel wrote {wrong} wrong elements at {size} bytes")
        size *= 2
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "gpu-kernels", "device": name, "timing": timing,
                       "rows": rows}, f, indent=1)
    return rows


def main(argv):
    run(build_parser().parse_args(argv))
    return 0
