"""Checks torch tensors and hands them to hora's core.

Shared by the public collectives (``mpi_ops``), their gradients
(``_autograd``), the optimizer, the broadcast helpers and SyncBatchNorm.
The ``start_*`` functions submit already-checked tensors and return the
core's works plus a function that builds the result from them; the
``*_now`` shorthands wait for it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import torch
import torch.utils.dlpack

from hora.common import basics
from hora.common._adapter import submission
from hora.common._adapter.handles import Handle, OneHandle, synchronize
from hora.common._adapter.naming import check_name
from hora.common._adapter.submission import (
    KIND_ALLGATHER, KIND_ALLREDUCE, KIND_ALLTOALL, KIND_BROADCAST, KIND_REDUCESCATTER)
from hora.common._adapter.checks import (  # noqa: F401 (used by the other torch modules)
    check_op, check_root, check_splits, process_set_id, resolve_op, unsupported_dtype)
from hora.common.basics import (  # noqa: F401 (re-exported)
    Adasum, Average, Max, Min, ReduceOp, Sum)
from hora.common.exceptions import HoraTypeError
from hora.common.process_sets import (  # noqa: F401 (used by the other torch modules)
    ProcessSet, global_process_set, set_rank, set_size)

SUPPORTED_DTYPES = (torch.uint8, torch.int8, torch.uint16, torch.int16, torch.int32, torch.int64,
                    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool)
# The core's code for each, for tensors handed over by pointer.
_CORE_DTYPES = {d: submission.DTYPE_CODES[str(d).replace("torch.", "")]
                for d in SUPPORTED_DTYPES}
_STRIDED = torch.strided
# Tensor types whose checks may take the passes of _plain_host_tensors.
_PLAIN_TYPES = frozenset({torch.Tensor, torch.nn.Parameter})
_is_contiguous = torch.Tensor.is_contiguous
_data_ptr = torch.Tensor.data_ptr


# --- argument checks ---------------------------------------------------------

#: The core's id of a ``process_set=`` argument (0 for the global set), or
#: the error for a bad one (see hora.common._adapter.checks).
set_id = process_set_id


def set_object(process_set: ProcessSet | None) -> ProcessSet:
    """``process_set`` with None spelled as the global set."""
    return global_process_set if process_set is None else process_set


def check_tensor(tensor, what):
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    if not (tensor.is_cpu or tensor.is_cuda):  # cheaper than reading tensor.device
        raise ValueError(
            f"{what}: the tensor is on device '{tensor.device}'; hora.torch handles CPU and "
            f"CUDA tensors")
    if tensor.layout != torch.strided:
        raise ValueError(f"{what}: {tensor.layout} tensors are not supported; use a dense tensor "
                         f"(.to_dense())")
    if tensor.dtype not in _CORE_DTYPES:
        raise unsupported_dtype(what, str(tensor.dtype),
                                [str(d).replace("torch.", "") for d in SUPPORTED_DTYPES])


def check_tensors(tensors, what):
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{what}: expected a list of tensors, got a single tensor")
    tensors = list(tensors)
    if _plain_host_tensors(tensors):
        return tensors
    # One pass for the rest (CUDA tensors, subclasses); the messages are
    # built only for a tensor that fails.
    for i, tensor in enumerate(tensors):
        if not (isinstance(tensor, torch.Tensor) and (tensor.is_cpu or tensor.is_cuda)
                and tensor.layout is _STRIDED and tensor.dtype in _CORE_DTYPES):
            check_tensor(tensor, f"{what} (tensor {i})")
    return tensors


def _plain_host_tensors(tensors):
    """Whether ``tensors`` are all strided host tensors (plain or
    parameters) of dtypes the core takes: the common case of a grouped call,
    which may hold hundreds of tensors, checked in list passes that each
    stay in C (about a third of the cost of one Python loop over them)."""
    n = len(tensors)
    return (set(map(type, tensors)) <= _PLAIN_TYPES
            and [t.is_cpu for t in tensors].count(True) == n
            and [t.layout for t in tensors].count(_STRIDED) == n
            and {t.dtype for t in tensors} <= _CORE_DTYPES.keys())


def splits_list(splits, what):
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor):
        if splits.dtype.is_floating_point or splits.dtype == torch.bool:
            raise HoraTypeError(f"{what}: splits must hold integers, got {splits.dtype}")
        return [int(s) for s in splits.reshape(-1).tolist()]
    return check_splits(splits, what)


# --- submission ----------------------------------------------------------------

def _dense(t):
    if t.numel() == 0:
        # torch may give empty tensors any strides; the core wants row-major ones
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)
    return t if t.is_contiguous() else t.contiguous()


def as_input(tensor):
    """The tensor as the core reads it: detached (DLPack refuses tensors
    that require grad) and contiguous."""
    return _dense(tensor.detach())


_gpu_built = None
_staging_warned = False
_adasum_staging_warned = False


def _core_has_gpu() -> bool:
    global _gpu_built
    if _gpu_built is None:
        _gpu_built = basics.cuda_built()
    return _gpu_built


class _StagedWork:
    """A core Work on host copies of CUDA tensors (a build without GPU
    support): waiting copies the results back to the GPU tensors."""

    def __init__(self, work, copies, device):
        self._work = work
        self._copies = copies
        self.staged_device = device

    def wait(self):
        self._work.wait()
        for target, host in self._copies:
            target.copy_(host)
        self._copies = []

    def __getattr__(self, name):
        return getattr(self._work, name)


def _submit_staged(kind, names, inputs, outputs, op, root, prescale, postscale, splits,
                   grouped, process_set):
    global _staging_warned, _adasum_staging_warned
    if _core_has_gpu():  # only Adasum comes here in a GPU build
        if not _adasum_staging_warned:
            _adasum_staging_warned = True
            warnings.warn(
                "hora.torch: op=Adasum has no GPU implementation in hora; CUDA tensors are "
                "copied to host memory, combined there and copied back", RuntimeWarning,
                stacklevel=4)
    elif not _staging_warned:
        _staging_warned = True
        warnings.warn(
            "hora.torch: this build of hora has no GPU support, so CUDA tensors are copied "
            "through host memory for every collective (slow). Rebuild with HORA_WITH_CUDA=1 "
            "(NCCL) for GPU collectives; `horarun --check-build` shows what is built in.",
            RuntimeWarning, stacklevel=4)
    host_inputs = [t.cpu() for t in inputs]
    host_outputs, copies = None, [[] for _ in inputs]
    if outputs is not None:
        host_outputs = []
        for i, (x, out) in enumerate(zip(inputs, outputs)):
            if out is x:
                host_outputs.append(host_inputs[i])  # in place stays in place
            else:
                host_outputs.append(torch.empty_like(host_inputs[i]))
            if out.is_cuda:
                copies[i].append((out, host_outputs[i]))
    works = submission.submit_tensors(kind, names, host_inputs, host_outputs, op, root, prescale,
                                      postscale, splits, grouped, process_set=process_set)
    return [_StagedWork(w, c, x.device) for w, c, x in zip(works, copies, inputs)]


def submit(kind: int, names: Iterable[str], inputs: Iterable[torch.Tensor],
           outputs: Iterable[torch.Tensor] | None = None, op: ReduceOp | int = Sum,
           root: int = 0, prescale: float = 1.0, postscale: float = 1.0,
           splits: list[int] | None = None, grouped: bool = False,
           process_set: int = 0) -> list[Any]:
    """Hands tensors to the core. CUDA tensors go to NCCL ordered after the
    work queued on torch's current stream (and later work on that stream
    sees the results); without GPU support in the build they are staged
    through host memory, as are allreduces with op=Adasum, which has no GPU
    implementation. ``process_set`` is the set's id (0: every rank);
    ``root`` stays a global rank."""
    names, inputs = list(names), list(inputs)
    outputs = None if outputs is None else list(outputs)
    stream = -1  # host tensors
    on_gpu = [x.is_cuda for x in inputs]
    if any(on_gpu):
        if not all(on_gpu):
            raise ValueError(f"{names[0]}: a grouped collective takes tensors on one kind of "
                             f"device; these mix CPU and CUDA tensors")
        if not _core_has_gpu() or (kind == KIND_ALLREDUCE and int(op) == int(Adasum)):
            return _submit_staged(kind, names, inputs, outputs, op, root, prescale, postscale,
                                  splits, grouped, process_set)
        stream = torch.cuda.current_stream(inputs[0].device).cuda_stream
    return submission.submit_tensors(kind, names, inputs, outputs, op, root, prescale, postscale,
                                     splits, grouped, stream, process_set)


def owned_result(work, dtype):
    """The core-allocated result of an allgather/alltoall/reducescatter."""
    if work.on_gpu:
        return torch.utils.dlpack.from_dlpack(work.result_dlpack())
    shape = tuple(int(d) for d in work.output_shape)
    if math.prod(shape) == 0:
        result = torch.empty(shape, dtype=dtype)
    else:
        result = torch.frombuffer(work.result_buffer(), dtype=dtype).reshape(shape)
    device = getattr(work, "staged_device", None)
    return result if device is None else result.to(device)


#: Grouped allreduces of host tensors go flattened, as on a GPU, rather
#: than by data pointer (the tests set it to run the GPU path's logic).
FLATTEN_HOST_GROUPS = False


def _packing(tensors, op):
    """How a grouped allreduce of ``tensors`` (checked, not empty) travels:
    ``"pointers"`` (host tensors: the core reads each where it is),
    ``"flat"`` (CUDA tensors: flattened into one), or None (one request per
    tensor: mixed dtypes or devices, or Adasum, which combines each tensor
    on its own). Every rank of a correct program decides the same."""
    if int(op) == int(Adasum):
        return None
    first, n = tensors[0], len(tensors)
    if ([t.dtype for t in tensors].count(first.dtype) != n
            or [t.is_cpu for t in tensors].count(first.is_cpu) != n):
        return None
    on_cpu = first.is_cpu
    if not on_cpu:
        return "flat" if _core_has_gpu() else None
    return "flat" if FLATTEN_HOST_GROUPS else "pointers"


def _start_packed(tensors, names, op, prescale, postscale, in_place, process_set, packing):
    """A grouped allreduce of tensors of one dtype as one packed request,
    which carries every member's shape for the ranks to compare: one
    request and one Work, however many tensors. By ``"pointers"`` the core
    reads and writes host tensors where they are; ``"flat"`` reduces a
    flattened copy (one DLPack export) on the tensors' device. Returns
    (works, finish); ``finish`` puts the results in place and returns the
    tensors, or returns the new tensors of an out-of-place call."""
    if packing == "flat":
        return _start_flat(tensors, names[0], op, prescale, postscale, in_place, process_set)
    inputs, copy_back = tensors, []
    if not all(map(_is_contiguous, tensors)):
        inputs = []
        for t in tensors:
            if t.is_contiguous():
                inputs.append(t)
            else:
                dense = t.detach().contiguous()
                inputs.append(dense)
                if in_place:
                    copy_back.append((t, dense))
    if in_place:
        outputs, out_ptrs = tensors, None
    else:
        outputs = list(map(torch.empty_like, inputs))
        out_ptrs = list(map(_data_ptr, outputs))
    work = submission.submit_packed(
        (inputs, outputs), names[0], _CORE_DTYPES[inputs[0].dtype],
        list(map(_data_ptr, inputs)), out_ptrs, [x.shape for x in inputs], op, prescale,
        postscale, process_set)

    def finish():
        with torch.no_grad():
            for target, dense in copy_back:
                target.copy_(dense)
        return outputs
    return [work], finish


def _submit_flat(flat, name, shapes, op, prescale, postscale, process_set):
    """Submits ``flat``, a contiguous 1-d tensor holding members of
    ``shapes`` end to end, as one packed allreduce in place; a CUDA one
    after the work queued on the current stream. Returns the works."""
    stream = torch.cuda.current_stream(flat.device).cuda_stream if flat.is_cuda else -1
    return [submission.submit_packed(flat, name, _CORE_DTYPES[flat.dtype], flat, None, shapes,
                                     op, prescale, postscale, process_set, stream)]


def _start_flat(tensors, name, op, prescale, postscale, in_place, process_set):
    with torch.no_grad():
        flat = torch._C._nn.flatten_dense_tensors(tensors)
    works = _submit_flat(flat, name, [t.shape for t in tensors], op, prescale, postscale,
                         process_set)
    results = []

    def finish():
        # made once the reduction is done (on a GPU, the caller's stream
        # waits for it before these kernels): the results are copied out
        # of the reduced buffer, into the tensors themselves or into new
        # ones, since views of one buffer would tie the results' memory
        # together and could not be changed in place under autograd
        # (Horovod's are separate tensors too)
        if not results:
            views = torch._C._nn.unflatten_dense_tensors(flat, tensors)
            targets = tensors if in_place else [
                torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
            with torch.no_grad():
                torch._foreach_copy_(targets, views)
            results.extend(targets)
        return results
    return works, finish


#: An out-of-place allreduce of a host tensor up to this size copies the
#: tensor into its result and reduces that in place, by pointer: the copy
#: costs less than the DLPack exports of input and output that it saves
#: (a 2.5 KiB tensor: about 30 against 50 us at 1 rank). Above it the copy
#: would be the larger cost.
SMALL_COPY_BYTES = 64 * 1024


def start_allreduce(tensors, names, op, prescale, postscale, grouped, process_set=0):
    if len(tensors) == 1 and not grouped:
        t = tensors[0]
        if t.is_cpu and 0 < t.numel() * t.element_size() <= SMALL_COPY_BYTES:
            out = t.detach().clone(memory_format=torch.contiguous_format)
            work = submission.submit_one_host(KIND_ALLREDUCE, names[0], out, out.data_ptr(),
                                              out.shape, _CORE_DTYPES[out.dtype], op, 0, prescale,
                                              postscale, process_set)
            return [work], [out]
    inputs = [as_input(t) for t in tensors]
    outputs = [torch.empty_like(x, memory_format=torch.contiguous_format) for x in inputs]
    works = submit(KIND_ALLREDUCE, names, inputs, outputs, op, 0, prescale, postscale,
                   grouped=grouped, process_set=process_set)
    return works, outputs


def allreduce_handle(tensors, names, op, prescale, postscale, grouped, process_set=0):
    """Starts an allreduce of checked ``tensors`` into new tensors; returns
    a Handle whose result is their list. A grouped one travels packed where
    it can (see :func:`_packing`)."""
    packing = _packing(tensors, op) if grouped and tensors else None
    if packing is not None:
        works, finish = _start_packed(tensors, names, op, prescale, postscale, False,
                                      process_set, packing)
        return Handle(works, lambda ws: finish())
    works, outputs = start_allreduce(tensors, names, op, prescale, postscale, grouped,
                                     process_set)
    return Handle(works, lambda ws: outputs)


def bucket_packable(tensor, op):
    """Whether a flat bucket (one dense tensor holding several gradients end
    to end) on ``tensor``'s device can go to the core as one packed tensor."""
    return int(op) != int(Adasum) and (tensor.is_cpu or (tensor.is_cuda and _core_has_gpu()))


def start_bucket(flat, views, grads, name, op, prescale, postscale, process_set=0):
    """Starts the allreduce of a bucket's gradients ``grads`` into
    ``views``, views laid end to end in ``flat`` (a contiguous 1-d tensor)
    and shaped as the gradients: the request carries every member's shape
    (a mismatch names the member), and the result lands in the views with
    nothing copied back. Gradients that already are their views (after
    ``zero_grad(set_to_none=False)``) are reduced in place as one tensor.
    On the host the core reads the other gradients where they are and
    writes the views; on a GPU they are copied into the views first and the
    bucket goes as one tensor. Returns a Handle whose result is ``views``."""
    stale = [i for i, (g, v) in enumerate(zip(grads, views)) if g is not v]
    shapes = [v.shape for v in views]
    if flat.is_cpu:
        inputs = list(grads)
        odd = [i for i in stale if not grads[i].is_contiguous()]
        if odd:  # e.g. channels_last: the core reads row-major memory
            with torch.no_grad():
                torch._foreach_copy_([views[i] for i in odd], [grads[i] for i in odd])
            for i in odd:
                inputs[i] = views[i]
        outputs = [v.data_ptr() for v in views] if stale else None
        works = [submission.submit_packed(
            (flat, inputs), name, _CORE_DTYPES[flat.dtype], [x.data_ptr() for x in inputs],
            outputs, shapes, op, prescale, postscale, process_set)]
    else:
        if stale:
            with torch.no_grad():
                torch._foreach_copy_([views[i] for i in stale], [grads[i] for i in stale])
        works = _submit_flat(flat, name, shapes, op, prescale, postscale, process_set)
    return Handle(works, lambda ws: views)


def start_inplace(kind, tensors, names, op=Sum, root=0, prescale=1.0, postscale=1.0,
                  grouped=False, process_set=0):
    """Submits an in-place collective; returns (works, finish) where finish
    copies results back into tensors that had to be made contiguous."""
    packing = _packing(tensors, op) if grouped and kind == KIND_ALLREDUCE and tensors else None
    if packing is not None:
        works, finish = _start_packed(tensors, names, op, prescale, postscale, True,
                                      process_set, packing)
        return works, finish
    buffers, copy_back = [], []
    for tensor in tensors:
        t = tensor.detach()
        buffers.append(_dense(t))
        if buffers[-1] is not t and t.numel():
            copy_back.append((t, buffers[-1]))
    works = submit(kind, names, buffers, buffers, op, root, prescale, postscale, grouped=grouped,
                   process_set=process_set)

    def finish():
        for target, buffer in copy_back:
            target.copy_(buffer)
    return works, finish


def start_inplace_one(kind, tensor, name, op=Sum, root=0, prescale=1.0, postscale=1.0,
                      process_set=0):
    """One checked tensor, in place: returns a handle whose result is
    ``tensor``. A contiguous CPU tensor (every gradient of a CPU model) is
    handed to the core by pointer, which costs a fraction of a DLPack
    export; anything else takes :func:`start_inplace`."""
    if tensor.is_cpu and tensor.is_contiguous() and tensor.numel():
        work = submission.submit_one_host(kind, name, tensor, tensor.data_ptr(), tensor.shape,
                                          _CORE_DTYPES[tensor.dtype], op, root, prescale,
                                          postscale, process_set)
        return OneHandle(work, tensor)
    works, finish = start_inplace(kind, [tensor], [name], op, root, prescale, postscale,
                                  process_set=process_set)
    return Handle(works, lambda ws: (finish(), tensor)[1])


def start_broadcast(tensor, root_rank, name, process_set=0):
    x = as_input(tensor)
    out = torch.empty_like(x)
    works = submit(KIND_BROADCAST, [name], [x], [out], root=root_rank, process_set=process_set)
    return works, lambda ws: out


def start_allgather(tensors, names, grouped=False, process_set=0):
    inputs = [as_input(t) for t in tensors]
    dtypes = [x.dtype for x in inputs]
    works = submit(KIND_ALLGATHER, names, inputs, grouped=grouped, process_set=process_set)
    return works, lambda ws: [owned_result(w, d) for w, d in zip(ws, dtypes)]


def start_reducescatter(tensors, names, op, prescale, postscale, grouped=False, process_set=0):
    inputs = [as_input(t) for t in tensors]
    dtypes = [x.dtype for x in inputs]
    works = submit(KIND_REDUCESCATTER, names, inputs, op=op, prescale=prescale,
                   postscale=postscale, grouped=grouped, process_set=process_set)
    return works, lambda ws: [owned_result(w, d) for w, d in zip(ws, dtypes)]


def start_allgather_into(tensor, output, name, process_set=0):
    """An allgather of a contiguous host tensor straight into ``output``, a
    contiguous host tensor of the gathered size (``tensor`` may be this
    rank's rows of it already). Returns the works."""
    return submit(KIND_ALLGATHER, [name], [tensor], [output], process_set=process_set)


def start_reducescatter_in_place(tensor, name, op, prescale, postscale, process_set=0):
    """A reducescatter of a contiguous host tensor that writes this rank's
    block of the result over that block of ``tensor`` (the rest is left
    with partial sums): no result buffer, and the ring reduces ``tensor``
    itself. Returns the works; the caller knows where its block lies."""
    return submit(KIND_REDUCESCATTER, [name], [tensor], [tensor], op=op, prescale=prescale,
                  postscale=postscale, process_set=process_set)


def start_alltoall(tensor, splits, name, process_set=0):
    x = as_input(tensor)
    works = submit(KIND_ALLTOALL, [name], [x], splits=splits, process_set=process_set)

    def finish(ws):
        received = torch.tensor([int(s) for s in ws[0].received_splits], dtype=torch.int32)
        return owned_result(ws[0], x.dtype), received
    return works, finish


def name_or_auto(name: str | None, kind: str, process_set: int = 0) -> str:
    """``name``, or the next automatic name of ``kind`` in the process set
    with id ``process_set`` (each set counts its unnamed calls on its own)."""
    return check_name(name, kind, process_set)


def grad_name(name, named, suffix):
    """Name of a collective run by a backward pass: derived from the forward
    name when the user gave one, matched by call order otherwise."""
    return f"{name}.{suffix}" if named else None


# Shorthands used by the backward passes (already-validated tensors).

def allreduce_now(tensor, op=Sum, name=None, prescale=1.0, postscale=1.0, process_set=0):
    works, outputs = start_allreduce([tensor], [name_or_auto(name, "allreduce", process_set)], op,
                                     prescale, postscale, False, process_set)
    return synchronize(Handle(works, lambda ws: outputs[0]))


def allgather_now(tensor, name=None, process_set=0):
    works, finish = start_allgather([tensor], [name_or_auto(name, "allgather", process_set)],
                                    process_set=process_set)
    return synchronize(Handle(works, lambda ws: finish(ws)[0]))


def reducescatter_now(tensor, op=Sum, name=None, process_set=0):
    works, finish = start_reducescatter([tensor],
                                        [name_or_auto(name, "reducescatter", process_set)], op,
                                        1.0, 1.0, process_set=process_set)
    return synchronize(Handle(works, lambda ws: finish(ws)[0]))


def sub_name(name, suffix):
    return None if name is None else f"{name}.{suffix}"
