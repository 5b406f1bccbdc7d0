"""hora.torch hands a contiguous CPU tensor's in-place allreduce and
broadcast to the core by pointer (data_ptr, shape, dtype). These cover what
that path must get right: views that start inside their storage, 0-d and
one-element tensors, every dtype, tensors nothing else refers to, and a
handle waited on from one thread while another polls it."""

import gc
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hora  # noqa: E402
import hora.torch as hvd  # noqa: E402
from conftest import ALL_DTYPES  # noqa: E402
from hora_reference import assert_reduced, inputs_of, reduce_reference  # noqa: E402
from torch_helpers import to_numpy, torch_input  # noqa: E402


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_in_place(dtype, rank, size):
    x = torch_input("pointer.dtype", rank, (5, 3), dtype)
    before = x.data_ptr()
    op = hora.Max if dtype == "bool" else hora.Sum
    result = hvd.synchronize(hvd.allreduce_async_(x, name=f"pointer.dtype.{dtype}", op=op))
    assert result is x and x.data_ptr() == before
    expected = reduce_reference(inputs_of("pointer.dtype", range(size), (5, 3), dtype), op, dtype)
    assert_reduced(to_numpy(x), expected, op)


def test_a_view_inside_its_storage_touches_only_its_rows(rank, size):
    base = torch.full((4, 6), -1.0)
    row = base[1]  # contiguous, storage offset 6
    row.copy_(torch.arange(6, dtype=torch.float32) + rank)
    hvd.allreduce_(row, name="pointer.view", op=hvd.Sum)
    expected = sum(np.arange(6, dtype=np.float32) + r for r in range(size))
    np.testing.assert_array_equal(base[1].numpy(), expected)
    # the rows around it are untouched
    np.testing.assert_array_equal(base[[0, 2, 3]].numpy(), -np.ones((3, 6), np.float32))


def test_zero_d_and_one_element_tensors(rank, size):
    scalar = torch.tensor(float(rank + 1))
    one = torch.tensor([rank + 1], dtype=torch.int64)
    hvd.allreduce_(scalar, name="pointer.scalar", op=hvd.Sum)
    hvd.broadcast_(one, root_rank=size - 1, name="pointer.one")
    assert scalar.shape == () and scalar.item() == size * (size + 1) / 2
    assert one.tolist() == [size]


def test_a_tensor_nothing_else_refers_to(rank, size):
    handle = hvd.allreduce_async_(torch.full((1000,), float(rank)), name="pointer.temporary",
                                  op=hvd.Sum)
    gc.collect()
    result = hvd.synchronize(handle)
    assert torch.equal(result, torch.full((1000,), float(sum(range(size)))))


def test_noncontiguous_and_empty_tensors_still_work(rank, size):
    wide = torch.arange(12, dtype=torch.float32).reshape(3, 4) + rank
    column = wide[:, 1]  # strided: the general path copies and copies back
    empty = torch.empty(0, 5)
    hvd.allreduce_(column, name="pointer.column", op=hvd.Sum)
    hvd.allreduce_(empty, name="pointer.empty", op=hvd.Sum)
    expected = sum(np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1] + r for r in range(size))
    np.testing.assert_array_equal(wide[:, 1].numpy(), expected)
    assert empty.shape == (0, 5)


def test_poll_never_sees_a_result_another_thread_still_waits_for(rank, size):
    # One thread waits on the handle (giving up the GIL) while this one polls
    # it: poll must not say done before the result is in the tensor.
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over often, to open the window
    try:
        for step in range(5):
            x = torch.full((4_000_000,), float(rank + 1))
            handle = hvd.allreduce_async_(x, name=f"pointer.poll.{step}", op=hvd.Sum)
            waiter = threading.Thread(target=hvd.synchronize, args=(handle,))
            waiter.start()
            while not hvd.poll(handle):
                pass
            seen = float(x[-1])
            waiter.join()
            assert seen == size * (size + 1) / 2, f"step {step}: poll said done too early"
    finally:
        sys.setswitchinterval(switch)
