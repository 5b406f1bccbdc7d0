"""Large temporary host buffers of the sharded optimizer, in huge pages.

A flat bucket or gathered parameters are tens of MiB written once per
step. Touched in 4 KiB pages, first writes fault once per page, which on
the test machine cost as much as the collective that fills the buffer.
Transparent huge pages (in the kernel's "madvise" mode, the common
default) are granted only to memory that asks for them, as NumPy's and
hora's core's large buffers do.
"""

from __future__ import annotations

import ctypes
import sys

import torch

_HUGE = 2 << 20
_MADV_HUGEPAGE = 14


def _madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


_madvise_function = _madvise()


def empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``torch.empty(numel)``, asking for huge pages when it is a large host
    buffer (the whole 2 MiB pages inside it; before anything touches it)."""
    tensor = torch.empty(numel, dtype=dtype, device=device)
    nbytes = tensor.numel() * tensor.element_size()
    if _madvise_function is not None and tensor.device.type == "cpu" and nbytes >= 2 * _HUGE:
        start = (tensor.data_ptr() + _HUGE - 1) // _HUGE * _HUGE
        end = (tensor.data_ptr() + nbytes) // _HUGE * _HUGE
        if end > start:
            _madvise_function(start, end - start, _MADV_HUGEPAGE)
    return tensor
