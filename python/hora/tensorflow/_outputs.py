"""Result arrays for the collectives TensorFlow runs every step.

A collective inside a graph runs its NumPy function every step, and each
call used to write its results into new arrays, which cost twice over for
large results (ResNet-18's 44.6 MiB of gradients, 2 ranks on the 2-core
test machine):

- TensorFlow copies a NumPy result into a tensor of its own unless the
  array starts on a 64-byte boundary, and NumPy's large arrays start 16
  bytes into a page: 6 ms a step. An array that is aligned becomes the
  tensor's buffer, the tensor holding a reference to it.
- A new array is fresh memory: the first write to each of its pages
  faults and the kernel clears the page: 12 ms a step.

An :class:`OutputPool` hands out 64-byte-aligned arrays, and the same ones
again once nothing but the pool refers to them: TensorFlow drops its
reference when the tensor built on the array is freed (at the latest when
its next NumPy function runs), and an array that a tensor still uses, or
that anyone else holds, is never handed out.
"""

from __future__ import annotations

import sys
import threading

import numpy as np


def _references(arrays: list, k: int) -> int:
    """How many references ``arrays[k]`` has, counted the way the pool
    counts them (the interpreter's own temporary references included)."""
    return sys.getrefcount(arrays[k])


# What _references says of an array held by nothing but its list; measured
# rather than assumed, since interpreters count their temporaries
# differently (3.14 borrows some).
_UNUSED_REFERENCES = _references([object()], 0)
# What TensorFlow needs to use an array's memory as a tensor's buffer
# (EIGEN_MAX_ALIGN_BYTES).
ALIGNMENT = 64


def aligned_empty(shape: tuple, dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts on an
    ALIGNMENT-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = -raw.ctypes.data % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class OutputPool:
    """Arrays by slot (a result's place among its reduction's results) and
    shape, at most ``per_slot`` kept for each: the step running, the
    results of the one before that TensorFlow may still hold, and one more.
    Only the array itself may be handed on (to TensorFlow or anyone): a
    view of it would hold the memory without being counted."""

    def __init__(self, per_slot: int = 3) -> None:
        self.per_slot = per_slot
        self._arrays: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()  # graphs may run the same node on two threads

    def like(self, slot: object, x: np.ndarray) -> np.ndarray:
        """A C-contiguous array of ``x``'s shape and dtype for the result in
        ``slot`` that nothing else refers to (its contents are stale)."""
        key = (slot, x.shape, x.dtype.str)
        with self._lock:
            arrays = self._arrays.setdefault(key, [])
            for k in range(len(arrays)):
                if _references(arrays, k) <= _UNUSED_REFERENCES:
                    return arrays[k]
            array = aligned_empty(x.shape, x.dtype)
            if len(arrays) < self.per_slot:
                arrays.append(array)
            return array
