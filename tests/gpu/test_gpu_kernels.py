"""The CUDA kernels against CPU references: batched copies (odd sizes, odd
alignments, more tensors than one launch takes), scaled copies and casts,
integer division, fills."""
import pytest
import torch

from hora._loader import _C

CODES = _C.DTYPES
DEVICE = "cuda"
SIZES = [0, 1, 3, 15, 16, 17, 255, 1023, 4097, 100003]
OFFSETS = [0, 1, 3, 5]  # elements into a larger buffer: 16-byte, 4-byte and byte alignment


def code(dtype):
    name = str(dtype).replace("torch.", "")
    return CODES[name]


def ramp(count, dtype, offset=0):
    base = torch.arange(count + offset, dtype=torch.float64) * 0.37 - 11.0
    if dtype in (torch.uint8, torch.bool):
        base = torch.arange(count + offset) % 7
    host = base.to(dtype)
    return host.to(DEVICE)[offset:]


def scaled_copy(pairs, src_dtype, dst_dtype, scale=1.0, divisor=1):
    tasks = [(src.data_ptr(), dst.data_ptr(), src.numel()) for src, dst in pairs]
    _C.gpu_scaled_copy(tasks, code(src_dtype), code(dst_dtype), scale, divisor,
                       torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()


pytestmark = pytest.mark.usefixtures("needs_cuda_build")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16, torch.float32, torch.float64,
                                   torch.int64, torch.bool])
@pytest.mark.parametrize("offset", OFFSETS)
def test_batched_plain_copy_every_size_and_alignment(dtype, offset):
    sources = [ramp(n, dtype, offset) for n in SIZES]
    targets = [torch.empty(n + offset + 2, dtype=dtype, device=DEVICE)[offset + 1:offset + 1 + n]
               for n in SIZES]
    scaled_copy(list(zip(sources, targets)), dtype, dtype)
    for s, t in zip(sources, targets):
        assert torch.equal(s.cpu(), t.cpu())


def test_more_tensors_than_one_launch_takes():
    sources = [ramp(7 + k, torch.float32) for k in range(250)]  # > kMaxTasksPerLaunch (96)
    targets = [torch.zeros_like(s) for s in sources]
    scaled_copy(list(zip(sources, targets)), torch.float32, torch.float32, scale=0.5)
    for s, t in zip(sources, targets):
        assert torch.equal((s.cpu() * 0.5), t.cpu())


@pytest.mark.parametrize("src_dtype,dst_dtype", [
    (torch.float32, torch.float16), (torch.float16, torch.float32),
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
    (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32), (torch.float64, torch.float64)])
@pytest.mark.parametrize("offset", [0, 1])
def test_scaled_casts_match_torch_on_the_cpu(src_dtype, dst_dtype, offset):
    count = 10007
    src = ramp(count, src_dtype, offset)
    dst = torch.empty(count, dtype=dst_dtype, device=DEVICE)
    scaled_copy([(src, dst)], src_dtype, dst_dtype, scale=0.3)
    compute = torch.float64 if src_dtype == torch.float64 else torch.float32
    expected = (src.cpu().to(compute) * torch.tensor(0.3, dtype=compute)).to(dst_dtype)
    assert torch.equal(dst.cpu(), expected)


@pytest.mark.parametrize("src_dtype,dst_dtype", [
    (torch.int16, torch.int32), (torch.int32, torch.int16), (torch.int32, torch.int32),
    (torch.int64, torch.int64), (torch.int8, torch.int8), (torch.uint8, torch.uint8)])
def test_integer_division_truncates_like_cpp(src_dtype, dst_dtype):
    values = torch.arange(-300, 300, dtype=torch.int64)
    if src_dtype == torch.uint8:
        values = torch.arange(0, 256)
    elif src_dtype == torch.int8:
        values = torch.arange(-128, 128)
    src = values.to(src_dtype).to(DEVICE)
    dst = torch.empty(src.numel(), dtype=dst_dtype, device=DEVICE)
    scaled_copy([(src, dst)], src_dtype, dst_dtype, divisor=3)
    expected = torch.div(values, 3, rounding_mode="trunc").to(dst_dtype)
    assert torch.equal(dst.cpu(), expected)


@pytest.mark.parametrize("element_bytes,dtype,pattern", [
    (1, torch.uint8, 0xAB), (2, torch.int16, 0x1234), (4, torch.int32, 0x01020304),
    (8, torch.int64, 0x0102030405060708)])
def test_fill(element_bytes, dtype, pattern):
    out = torch.zeros(4099, dtype=dtype, device=DEVICE)
    _C.gpu_fill(out.data_ptr(), out.numel(), element_bytes, pattern,
                torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.all(out.cpu() == pattern)


def test_unsupported_cast_is_refused():
    src = torch.ones(4, dtype=torch.float64, device=DEVICE)
    dst = torch.empty(4, dtype=torch.float16, device=DEVICE)
    with pytest.raises(RuntimeError, match="gpu_scaled_copy failed"):
        scaled_copy([(src, dst)], torch.float64, torch.float16)
