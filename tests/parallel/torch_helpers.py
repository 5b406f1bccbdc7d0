"""Shared pieces of the hora.torch tests: torch versions of the per-rank
inputs of conftest.py, and conversions for the NumPy references."""

import zlib

import numpy as np
import torch

from conftest import ALL_DTYPES, rank_input, resolve_dtype

TORCH_DTYPES = {
    "uint8": torch.uint8, "int8": torch.int8, "uint16": torch.uint16, "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float32": torch.float32, "float64": torch.float64, "bool": torch.bool,
}
assert len(TORCH_DTYPES) == len(ALL_DTYPES)


def torch_dtype(dtype):
    """The torch dtype of one of conftest.ALL_DTYPES."""
    return TORCH_DTYPES[resolve_dtype(dtype).name]


def to_torch(array, dtype):
    """``array`` (of ``dtype``) as a torch tensor; values are copied exactly."""
    array = np.array(array)
    if resolve_dtype(dtype).name == "bfloat16":
        return torch.from_numpy(array.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(array)


def to_numpy(tensor):
    """A torch result as a NumPy array of the matching dtype (ml_dtypes
    bfloat16 for torch.bfloat16), for the hora_reference assertions."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.float().numpy().astype(resolve_dtype("bfloat16"))
    return tensor.numpy()


def torch_input(tag, rank, shape, dtype):
    """rank_input as a torch tensor."""
    return to_torch(rank_input(tag, rank, shape, dtype), dtype)


def float_input(tag, rank, shape, dtype=torch.float64):
    """Continuous random values (for gradients), deterministic per (tag, rank)."""
    generator = torch.Generator().manual_seed(zlib.crc32(f"{tag}/{rank}".encode()))
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)


def needs_ranks(size):
    """Skips a test of gradient reduction in a job of one rank, where the
    optimizer reduces nothing and is the wrapped one, as in Horovod
    (tests/parallel/test_torch_optimizer.py checks that)."""
    if size == 1:
        import pytest
        pytest.skip("one rank reduces nothing (the wrapped optimizer steps alone), as in Horovod")
