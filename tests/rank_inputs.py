"""Inputs made from (test tag, rank), shared by the TensorFlow and MXNet
multi-rank tests, so every rank can compute any collective's expected
result over all ranks' inputs by itself."""

import zlib

import numpy as np


def rank_values(tag, rank, shape, dtype=np.float32):
    """Small exactly representable values, different for each (tag, rank):
    halves in [-2, 2] for floating types, integers in [-4, 4] (or [0, 4]
    unsigned) otherwise."""
    rng = np.random.default_rng(zlib.crc32(f"{tag}/{rank}".encode()))
    values = rng.integers(-4, 5, size=shape) / 2
    if np.dtype(dtype).kind in "iu":
        values = np.abs(values * 2) if np.dtype(dtype).kind == "u" else values * 2
    return values.astype(dtype)
