"""Type information for hora's compiled core (private: use the hora package).

Written by hand from csrc/bindings/*.cc and checked against the built module
by scripts/check_stubs.py (mypy's stubtest, run by scripts/check_style.sh):
a name, parameter, default or property that differs from the module fails it.
"""

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, overload, type_check_only

from typing_extensions import CapsuleType, TypeAlias

# Name -> the core's number for it; Python passes these numbers, never copies.
DTYPES: dict[str, int]
COLLECTIVE_KINDS: dict[str, int]
REDUCE_OPS: dict[str, int]

# The runtime (csrc/bindings/runtime.cc).

def init(
    comm_handle: int | None = None,
    ranks: Sequence[int] | None = None,
    dynamic_process_sets: bool = False,
) -> None: ...
def shutdown() -> None: ...
def reform() -> float: ...
def exclude(leaving: list[int]) -> tuple[bool, float]: ...
def start_growth(argv: list[str], count: int, info: list[tuple[str, str]] = ...) -> None: ...
def growth_state() -> str: ...
def cancel_growth() -> None: ...
def grow() -> float: ...
def joining() -> bool: ...
def join_world() -> float: ...
def is_initialized() -> bool: ...
def rank() -> int: ...
def size() -> int: ...
def local_rank() -> int: ...
def local_size() -> int: ...
def cross_rank() -> int: ...
def cross_size() -> int: ...
def is_homogeneous() -> bool: ...
def transport() -> str: ...
def finalize_mpi(exit_code: int = 0) -> None: ...

# Text entries ("version", "compiler", "mpi_library", ...), flags
# ("cuda_built", "mpi_built", "nccl_built", ...) and "cpu_kernels", a dict of
# kernel name -> whether this machine runs it.
def build_info() -> dict[str, Any]: ...
def start_timeline(path: str, mark_cycles: bool = False) -> None: ...
def stop_timeline() -> None: ...

# "fusion_threshold_bytes" (int), "cycle_time_ms" (float), "response_cache",
# "hierarchical", "autotuning" (bool) and "history": one tuple (cycle,
# fusion_threshold_bytes, cycle_time_ms, response_cache, hierarchical) per change.
def engine_parameters() -> dict[str, Any]: ...

# Also before init: then read from the environment.
def gradient_bucket_bytes() -> int: ...
def exact_reduce_gradients() -> bool: ...

# Process sets. Set 0 is every rank; the others are numbered by the core.
# Parameters named argN have no name in the bindings (positional only).
# add_process_set(ranks) -> the new set's id, and remove_process_set(id), are
# collective over the job and return once every rank has made the change.
def add_process_set(arg0: Sequence[int], /) -> int: ...
def remove_process_set(arg0: int, /) -> None: ...

# Set id -> its ranks (global ranks, ascending), for every registered set.
def process_sets() -> dict[int, list[int]]: ...

# process_set_info(id) -> (the set's ranks, this process's rank in it or -1).
def process_set_info(arg0: int, /) -> tuple[list[int], int]: ...

# Whether init() was asked for dynamic_process_sets.
def dynamic_process_sets() -> bool: ...

# Raises what a collective called `what` on set `id` (with a broadcast's
# root, a global rank) would raise at submission.
def check_process_set_call(id: int, root: int | None, what: str) -> None: ...

# Submitting collectives (csrc/bindings/ops.cc).

# pybind11's metaclass (pybind11_builtins.pybind11_type, a subclass of type),
# which every class of the module has; it exists here only for type checkers.
@type_check_only
class _pybind11_type(type): ...

class ResultBuffer(metaclass=_pybind11_type):
    """Result memory the core owns, read through the buffer protocol (bytes,
    one dimension, format "B"). Not constructible from Python."""

    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...

class Work(metaclass=_pybind11_type):
    """One submitted collective. Not constructible from Python: submit()
    returns it."""

    def wait(self) -> None: ...
    def wait_release(self) -> None: ...
    def poll(self) -> bool: ...

    # wait_for(seconds): waits at most that long; True once done (wait()
    # raises the error, if any).
    def wait_for(self, arg0: float, /) -> bool: ...
    def release(self) -> None: ...

    # The result the core allocated in host memory; None for an in-place
    # collective, a given output or a GPU result.
    def result_buffer(self) -> ResultBuffer | None: ...

    # A GPU result as a DLPack capsule ("dltensor"); None for host memory.
    def result_dlpack(self) -> CapsuleType | None: ...
    @property
    def on_gpu(self) -> bool: ...
    @property
    def output_shape(self) -> list[int]: ...
    @property
    def received_splits(self) -> list[int]: ...

class CollectiveOptions(metaclass=_pybind11_type):
    """How a submission runs; keep one per setting and reuse it."""

    def __init__(self) -> None: ...
    op: int
    # A global rank (the core maps it into the process set).
    root: int
    prescale: float
    postscale: float
    # alltoall: rows sent to each rank; None: equal shares.
    splits: list[int] | None
    # Per tensor: a dtype code that reinterprets its elements, or empty.
    dtypes: list[int]
    grouped: bool
    in_place: bool
    # Where the caller submitted it (logged at debug level).
    site: str
    # The caller's CUDA stream; -1: none (host memory only).
    stream: int
    # The set's id; 0: every rank.
    process_set: int

# What submit() takes as a tensor (csrc/bindings/tensor_arg.cc), tried in
# this order. The memory must be C-contiguous, writable where the collective
# writes into it, of a dtype in DTYPES, and stays referenced until the Work is
# released or done.
@type_check_only
class _SupportsBuffer(Protocol):
    """Host memory through the buffer protocol (PEP 688): NumPy arrays,
    memoryview, bytearray, ResultBuffer."""

    def __buffer__(self, flags: int, /) -> memoryview: ...

@type_check_only
class _SupportsCudaArrayInterface(Protocol):
    """GPU memory described by __cuda_array_interface__ (Numba, some CuPy
    versions): CUDA builds only, and only for objects without __dlpack__."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...

@type_check_only
class _SupportsDLPack(Protocol):
    """A DLPack producer (torch, TensorFlow, JAX, ...) of host, pinned or
    CUDA memory. The core calls __dlpack__(), or __dlpack__(stream=-1) when
    CollectiveOptions.stream names the producing stream, and takes the
    device from the capsule: it does not call __dlpack_device__."""

    def __dlpack__(self, *, stream: int | None = None) -> CapsuleType: ...

_Tensor: TypeAlias = _SupportsBuffer | _SupportsCudaArrayInterface | _SupportsDLPack
_InputT = TypeVar("_InputT", bound=_Tensor)
_OutputT = TypeVar("_OutputT", bound=_Tensor)

# (owner, data_ptr, shape, dtype code): contiguous host memory the caller
# describes itself (a torch CPU tensor's data_ptr(), shape and dtype); owner
# is kept alive until the collective is done.
_HostMemory: TypeAlias = tuple[object, int, Sequence[int], int]

# A list of tensors: one Work each, named by `names`; a grouped collective
# when options.grouped. `outputs`, a list as long, holds where each result
# goes (the input itself: in place); None: in place when options.in_place,
# else results the core allocates.
@overload
def submit(
    kind: int,
    tensors: list[_InputT],
    names: Sequence[str],
    options: CollectiveOptions,
    outputs: list[_OutputT] | None = None,
) -> list[Work]: ...

# Described host memory: an in-place allreduce or broadcast only; outputs
# is not read.
@overload
def submit(
    kind: int,
    tensors: _HostMemory,
    names: str,
    options: CollectiveOptions,
    outputs: None = None,
) -> Work: ...

# One tensor, and where its result goes (itself: in place; None: as for a
# list).
@overload
def submit(
    kind: int,
    tensors: _Tensor,
    names: str,
    options: CollectiveOptions,
    outputs: _Tensor | None = None,
) -> Work: ...

# A packed allreduce of tensors of one dtype (a core dtype code), one Work
# however many: inputs are host data pointers (outputs too, or None for in
# place) or one flattened tensor of every member (outputs None); shapes are
# the members'. owner keeps the memory alive until the Work is released.
def submit_packed(owner: object, name: str, dtype: int, inputs: list[int] | _Tensor,
                  outputs: list[int] | None, shapes: list[Sequence[int]],
                  options: CollectiveOptions) -> Work: ...

# Whether submissions should say where they come from (debug log level).
def records_call_sites() -> bool: ...

# Marks this rank as joined; returns the rank that joined last.
def join() -> int: ...

# python -m hora.bench negotiation (csrc/bindings/simulate.cc): per step, the
# wall and CPU seconds and the cycle counts of rank 0 and of the last rank,
# under "coordinator_wall", "coordinator_cpu", "coordinator_cycles",
# "last_rank_wall", "last_rank_cpu" and "last_rank_cycles".
def simulate_negotiation(ranks: int, tensors: int, steps: int) -> dict[str, list[float]]: ...

# CUDA builds only (csrc/bindings/gpu_kernels.cc): raw device addresses and
# cudaStream_t values. tasks: (source, destination, element count).
def gpu_scaled_copy(
    tasks: Sequence[tuple[int, int, int]],
    in_dtype: int,
    out_dtype: int,
    scale: float = 1.0,
    divisor: int = 1,
    stream: int = 0,
) -> None: ...
def gpu_fill(dst: int, count: int, element_bytes: int, pattern: int, stream: int = 0) -> None: ...
def gpu_memcpy(dst: int, src: int, bytes: int, stream: int = 0) -> None: ...
