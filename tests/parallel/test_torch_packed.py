"""A grouped allreduce of CPU tensors of one dtype travels packed: one
request whose members the core reads and writes by data pointer, with every
member's shape in the negotiation. These cover what that must keep from the
per-tensor path: values for every dtype, op and scaling, in place and not,
odd members (0-d, empty, non-contiguous, views inside a larger storage,
several views of one buffer), autograd, process sets, joined ranks, and
mismatches that name the member on every rank and leave the job usable."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hora  # noqa: E402
import hora.torch as hvd  # noqa: E402
from conftest import ALL_DTYPES  # noqa: E402
from hora_reference import assert_reduced, inputs_of, reduce_reference  # noqa: E402
from torch_helpers import to_numpy, torch_input  # noqa: E402

SHAPES = [(5, 3), (7,), (), (0, 4), (2, 1, 3)]


@pytest.fixture(params=["pointers", "flat"])
def packing(request, monkeypatch):
    """Each test runs by data pointer (host tensors) and flattened (the
    path of CUDA tensors, run here on the host)."""
    from hora.torch import _collectives
    monkeypatch.setattr(_collectives, "FLATTEN_HOST_GROUPS", request.param == "flat")
    return request.param


def _op_for(dtype):
    return hora.Max if dtype == "bool" else hora.Sum


@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_and_odd_members(packing, dtype, in_place, rank, size):
    tag = f"packed.{packing}.{dtype}.{in_place}"
    tensors = [torch_input(f"{tag}.{i}", rank, shape, dtype) for i, shape in enumerate(SHAPES)]
    pointers = [t.data_ptr() for t in tensors]
    op = _op_for(dtype)
    if in_place:
        results = hvd.grouped_allreduce_(tensors, name=tag, op=op)
        assert all(r is t for r, t in zip(results, tensors))
        assert [t.data_ptr() for t in tensors] == pointers
    else:
        results = hvd.grouped_allreduce(tensors, name=tag, op=op)
        assert all(r.data_ptr() != p for r, p in zip(results, pointers) if r.numel())
    for i, (shape, result) in enumerate(zip(SHAPES, results)):
        assert tuple(result.shape) == shape and result.is_contiguous()
        expected = reduce_reference(inputs_of(f"{tag}.{i}", range(size), shape, dtype), op, dtype)
        assert_reduced(to_numpy(result), expected, op)


def test_average_and_scale_factors_apply_to_every_member(packing, rank, size):
    tensors = [torch.full((3,), float(rank + 1)), torch.full((2, 2), 2.0 * (rank + 1))]
    results = hvd.grouped_allreduce(tensors, name="packed.scaled", op=hvd.Average,
                                    prescale_factor=2.0, postscale_factor=0.5)
    mean = (size + 1) / 2
    torch.testing.assert_close(results[0], torch.full((3,), mean))
    torch.testing.assert_close(results[1], torch.full((2, 2), 2.0 * mean))


def test_non_contiguous_and_views_of_one_buffer_in_place(packing, rank, size):
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6) + rank
    transposed = torch.ones(3, 5, dtype=torch.float64).t() * (rank + 1)  # not contiguous
    a, b = base[0], base[1]  # adjacent views: the core reduces them as one piece
    c = base[3]  # a view further on, with a row between that must stay as it was
    hvd.grouped_allreduce_([a, transposed, b, c], name="packed.views", op=hvd.Sum)
    reference = sum(np.arange(24, dtype=np.float64).reshape(4, 6) + r for r in range(size))
    np.testing.assert_array_equal(base[[0, 1, 3]].numpy(), reference[[0, 1, 3]])
    np.testing.assert_array_equal(base[2].numpy(), np.arange(12, 18) + rank)
    assert not transposed.is_contiguous()
    np.testing.assert_array_equal(transposed.numpy(),
                                  np.full((5, 3), size * (size + 1) / 2))


def test_mixed_dtypes_take_the_per_tensor_path(packing, rank, size):
    results = hvd.grouped_allreduce(
        [torch.full((2,), float(rank)), torch.full((3,), rank, dtype=torch.int32)],
        name="packed.mixed", op=hvd.Sum)
    total = size * (size - 1) // 2
    assert results[0].dtype == torch.float32 and results[1].dtype == torch.int32
    np.testing.assert_array_equal(results[0].numpy(), np.full(2, float(total)))
    np.testing.assert_array_equal(results[1].numpy(), np.full(3, total))


def test_gradients_flow_through_a_packed_allreduce(packing, rank, size):
    x = torch.full((3,), float(rank + 1), requires_grad=True)
    y = torch.full((2, 2), 1.0, requires_grad=True)
    a, b = hvd.grouped_allreduce([x, y], name="packed.grad", op=hvd.Sum)
    (a.sum() * 2 + b.sum()).backward()
    # the gradient of a Sum allreduce is the Sum allreduce of the gradients
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0 * size))
    torch.testing.assert_close(y.grad, torch.full((2, 2), 1.0 * size))


def test_repeated_calls_reuse_the_negotiated_layout(packing, rank, size):
    mean = (size - 1) / 2
    for step in range(5):
        tensors = [torch.full((4,), step + rank + 0.0), torch.full((2, 3), 2.0 * (step + rank))]
        results = hvd.grouped_allreduce(tensors, name="packed.repeat", op=hvd.Average)
        torch.testing.assert_close(results[0], torch.full((4,), step + mean))
        torch.testing.assert_close(results[1], torch.full((2, 3), 2.0 * (step + mean)))


def test_a_reshaped_member_is_named_on_every_rank_and_the_job_goes_on(packing, rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    shape = (3, 2) if rank == size - 1 else (2, 3)
    with pytest.raises(hvd.HoraMismatchError) as caught:
        hvd.grouped_allreduce([torch.ones(5), torch.ones(shape), torch.ones(1)],
                              name="packed.reshaped")
    message = str(caught.value)
    assert "Mismatched shape of member 1 (of 3 tensors packed together)" in message, message
    assert "'packed.reshaped.0'" in message and "[2, 3]" in message and "[3, 2]" in message
    assert f"rank {size - 1} sent [3, 2]" in message
    # the job stays usable, under the same name too
    results = hvd.grouped_allreduce([torch.ones(5), torch.ones(2, 3), torch.ones(1)],
                                    name="packed.reshaped", op=hvd.Sum)
    assert results[1].sum().item() == 6 * size


def test_member_counts_that_differ_are_named(packing, rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    count = 3 if rank == 0 else 2
    with pytest.raises(hvd.HoraMismatchError) as caught:
        hvd.grouped_allreduce([torch.ones(2)] * count, name="packed.count")
    message = str(caught.value)
    assert "Mismatched number of tensors packed in allreduce 'packed.count.0'" in message
    assert "rank 0 sent 3" in message, message


def test_one_rank_with_mixed_dtypes_fails_every_rank_instead_of_hanging(packing, rank, size):
    if size == 1:
        pytest.skip("needs two ranks to disagree")
    second = torch.ones(2, dtype=torch.float64 if rank == 0 else torch.float32)
    with pytest.raises(hvd.HoraMismatchError) as caught:
        hvd.grouped_allreduce([torch.ones(2), second], name="packed.dtype")
    assert "packed.dtype" in str(caught.value)
    hvd.barrier()


def test_packed_allreduce_in_a_process_set(packing, rank, size):
    if size < 2:
        pytest.skip("needs a set smaller than the job")
    members = list(range(size - 1))
    process_set = hvd.add_process_set(members)
    try:
        if rank in members:
            results = hvd.grouped_allreduce([torch.full((3,), 1.0), torch.full((2,), 2.0)],
                                            name="packed.set", op=hvd.Average,
                                            process_set=process_set)
            torch.testing.assert_close(results[1], torch.full((2,), 2.0))
    finally:
        hvd.remove_process_set(process_set)


def test_a_joined_rank_contributes_zeros_to_a_packed_allreduce(packing, rank, size):
    if size == 1:
        pytest.skip("needs a rank to join while others reduce")
    if rank == size - 1:
        last = hvd.join()
    else:
        results = hvd.grouped_allreduce_([torch.full((3,), 1.0), torch.full((2, 2), 1.0)],
                                         name="packed.join", op=hvd.Sum)
        np.testing.assert_array_equal(results[1].numpy(), np.full((2, 2), size - 1.0))
        last = hvd.join()
    # the others reduce only once the last rank has joined, so one of them joins last
    assert last != size - 1


def test_new_results_are_separate_tensors_that_autograd_lets_change(packing, rank, size):
    # as Horovod's: one result's memory is its own, and a result that
    # requires grad may be changed in place
    tensors = [torch.full((3,), float(rank), requires_grad=True), torch.ones(2, 2) * rank]
    results = hvd.grouped_allreduce(tensors, name="packed.separate", op=hvd.Sum)
    assert results[0].untyped_storage().data_ptr() != results[1].untyped_storage().data_ptr()
    assert results[0].untyped_storage().nbytes() == 3 * 4
    results[0].mul_(2)
    results[0].sum().backward()
    torch.testing.assert_close(tensors[0].grad, torch.full((3,), 2.0 * size))
    torch.testing.assert_close(results[1], torch.ones(2, 2) * (size * (size - 1) / 2))
