"""``Compression.powersgd`` in DistributedOptimizer: after the uncompressed
warm-up each compressible gradient becomes the rank-r approximation
``P Q^T`` of the ranks' average (with each rank's error fed back), the
same on every rank, and equal to a NumPy reference that simulates every
rank; vectors and matrices too small to shrink are averaged as they are."""

import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import hora.torch as hvd  # noqa: E402
from torch_helpers import needs_ranks  # noqa: E402

# name -> shape; with rank 1 "w" and "conv" (4 x 18) are compressed, with rank 2
# only "w" (4 x 18 would not shrink by 2); "bias"
# (a vector) and "small" (2 x 2 would not shrink) are sent as they are
SHAPES = {"w": (12, 10), "conv": (4, 2, 3, 3), "bias": (5,), "small": (2, 2)}
EPSILON = 1e-8


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name, shape in SHAPES.items():
            setattr(self, name, torch.nn.Parameter(torch.zeros(shape)))


def gradient(name, rank, step, passes=1):
    """The gradient rank ``rank`` accumulates for ``name`` at ``step`` over
    ``passes`` backward passes."""
    return sum(np.random.default_rng(1000 * (step * passes + i) + 10 * rank
                                     + list(SHAPES).index(name)).standard_normal(SHAPES[name])
               for i in range(passes))


def compressed_shape(shape, rank):
    if len(shape) < 2:
        return None
    n = shape[0]
    m = int(np.prod(shape)) // n
    r = min(rank, n, m)
    return (n, m) if n * m >= 2 * (n + m) * r else None


def orthonormalize(p):
    for i in range(p.shape[1]):
        p[:, i] /= np.linalg.norm(p[:, i]) + EPSILON
        for j in range(i + 1, p.shape[1]):
            p[:, j] -= p[:, i] * (p[:, i] @ p[:, j])


def reference(size, steps, start_iter, rank, passes=1, schedule=None):
    """Every step's reduced gradients and every rank's errors, simulated in
    float64 for all ranks (over the steps of ``schedule`` when given)."""
    q, errors, results = {}, {}, []
    for step in range(steps) if schedule is None else schedule:
        out = {}
        for name, shape in SHAPES.items():
            grads = [gradient(name, k, step, passes) for k in range(size)]
            matrix_shape = compressed_shape(shape, rank)
            if step < start_iter or matrix_shape is None:
                out[name] = np.mean(grads, axis=0)
                continue
            n, m = matrix_shape
            if name not in q:
                generator = torch.Generator().manual_seed(zlib.crc32(f"allreduce.{name}".encode()))
                q[name] = torch.randn(m, min(rank, n, m), generator=generator,
                                      dtype=torch.float64).numpy()
                errors[name] = [np.zeros((n, m)) for _ in range(size)]
            matrices = [g.reshape(n, m) + errors[name][k] for k, g in enumerate(grads)]
            p = np.mean([mat @ q[name] for mat in matrices], axis=0)
            orthonormalize(p)
            q[name] = np.mean([mat.T @ p for mat in matrices], axis=0)
            approximation = p @ q[name].T
            errors[name] = [mat - approximation for mat in matrices]
            out[name] = approximation.reshape(shape)
        results.append(out)
    return results, errors


def train(rank, steps, compression, op=hvd.Average, passes=1, poison=None, **kwargs):
    """``poison``: (step, rank, name, value) puts ``value`` into one element
    of that gradient there (rank None: on every rank; value 0: zeroes the
    whole gradient)."""
    net = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.0),
                                   named_parameters=net.named_parameters(),
                                   compression=compression, op=op,
                                   backward_passes_per_step=passes, **kwargs)
    seen = []
    for step in range(steps):
        opt.zero_grad()
        for i in range(passes):
            grads = {name: torch.tensor(gradient(name, rank, step * passes + i),
                                        dtype=torch.float32) for name in SHAPES}
            if poison is not None and poison[0] == step and poison[1] in (None, rank):
                if poison[3] == 0:
                    grads[poison[2]].zero_()
                else:
                    grads[poison[2]].view(-1)[3] = poison[3]
            loss = sum((getattr(net, name) * grads[name]).sum() for name in SHAPES)
            loss.backward()
        opt.step()
        seen.append({name: getattr(net, name).grad.double().numpy().copy() for name in SHAPES})
    return opt, seen


@pytest.mark.parametrize("rank_r", [1, 2])
def test_matches_the_reference_on_every_rank(rank, size, rank_r):
    needs_ranks(size)
    steps, start_iter = 5, 2
    compression = hvd.Compression.powersgd(rank=rank_r, start_iter=start_iter)
    opt, seen = train(rank, steps, compression, bucket_bytes=0)
    expected, errors = reference(size, steps, start_iter, rank_r)
    for step in range(steps):
        for name in SHAPES:
            np.testing.assert_allclose(seen[step][name], expected[step][name], rtol=2e-4,
                                       atol=2e-5, err_msg=f"step {step}, {name}")
    for name, per_rank in errors.items():
        kept = compression._state[f"allreduce.{name}"]["error"].double().numpy()
        np.testing.assert_allclose(kept, per_rank[rank], rtol=2e-4, atol=2e-5)
    assert set(errors) == ({"w", "conv"} if rank_r == 1 else {"w"})
    # identical on every rank, bit for bit
    flat = torch.cat([torch.from_numpy(seen[-1][name]).reshape(-1) for name in SHAPES])
    for other in hvd.allgather(flat.unsqueeze(0), name="powersgd.check"):
        assert torch.equal(other, flat)


def test_buckets_and_sum(rank, size):
    needs_ranks(size)
    # the gradients reduced together in one bucket, summed rather than averaged
    steps, start_iter = 4, 1
    _, seen = train(rank, steps, hvd.Compression.powersgd(start_iter=start_iter), op=hvd.Sum)
    expected, _ = reference(size, steps, start_iter, 1)
    for step in range(steps):
        for name in SHAPES:
            np.testing.assert_allclose(seen[step][name], size * expected[step][name],
                                       rtol=2e-4, atol=2e-5, err_msg=f"step {step}, {name}")


def test_accumulated_passes_in_a_process_set(rank, size):
    needs_ranks(size)
    # two backward passes per step, among ranks 0 and 1 only (below 3 ranks,
    # that is every rank: the global set)
    members = [0, 1] if size > 2 else list(range(size))
    process_set = hvd.add_process_set(members) if size > 2 else hvd.global_process_set
    try:
        if rank in members:
            steps, start_iter = 3, 1
            _, seen = train(rank, steps, hvd.Compression.powersgd(start_iter=start_iter),
                            passes=2, process_set=process_set)
            expected, _ = reference(len(members), steps, start_iter, 1, passes=2)
            for step in range(steps):
                for name in SHAPES:
                    np.testing.assert_allclose(seen[step][name], expected[step][name],
                                               rtol=2e-4, atol=2e-5,
                                               err_msg=f"step {step}, {name}")
    finally:
        if size > 2:
            hvd.remove_process_set(process_set)


def test_warm_up_is_plain_averaging(rank, size):
    _, seen = train(rank, 3, hvd.Compression.powersgd(start_iter=10))
    for step in range(3):
        for name in SHAPES:
            average = np.mean([gradient(name, k, step) for k in range(size)], axis=0)
            np.testing.assert_allclose(seen[step][name], average, rtol=1e-5, atol=1e-6)


def test_bad_arguments_raise():
    for kwargs, text in (({"rank": 0}, "rank must be an int >= 1"),
                         ({"rank": 1.5}, "rank must be an int >= 1"),
                         ({"start_iter": -1}, "start_iter must be an int >= 0"),
                         ({"min_compression_rate": 0.5}, "min_compression_rate must be")):
        with pytest.raises(ValueError, match=text):
            hvd.Compression.powersgd(**kwargs)
    net = Net()
    with pytest.raises(ValueError, match="cannot be combined with sharding"):
        hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                 named_parameters=net.named_parameters(),
                                 compression=hvd.Compression.powersgd(), sharding="gradients")
    with pytest.raises(ValueError, match="op=Adasum cannot be compressed"):
        hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                 named_parameters=net.named_parameters(),
                                 compression=hvd.Compression.powersgd(), op=hvd.Adasum)
    complex_weight = torch.nn.Parameter(torch.ones(4, 4, dtype=torch.complex64))
    with pytest.raises(ValueError, match="parameter 'z' is torch.complex64"):
        hvd.DistributedOptimizer(torch.optim.SGD([complex_weight], lr=0.1),
                                 named_parameters=[("z", complex_weight)],
                                 compression=hvd.Compression.powersgd())
    with pytest.raises(ValueError, match="a single collective takes Compression.none"):
        hvd.allreduce(torch.ones(3), name="powersgd.single",
                      compression=hvd.Compression.powersgd())


def test_an_overflow_is_handed_on_and_leaves_the_state_as_it_was(rank, size):
    needs_ranks(size)
    # one rank's gradient of "w" overflows at step 2 (as under GradScaler,
    # which then skips the step): every rank gets a non-finite "w" there,
    # and step 3 goes on from the state of step 1 rather than from NaNs
    compression = hvd.Compression.powersgd(start_iter=1)
    _, seen = train(rank, 4, compression, bucket_bytes=0,
                    poison=(2, size - 1, "w", float("inf")))
    assert not np.isfinite(seen[2]["w"]).all()
    skipped, _ = reference(size, 4, 1, 1, schedule=[0, 1, 3])
    normal, _ = reference(size, 4, 1, 1)
    np.testing.assert_allclose(seen[3]["w"], skipped[2]["w"], rtol=2e-4, atol=2e-5)
    for step in range(4):  # the other gradients, in the same collectives, untouched
        np.testing.assert_allclose(seen[step]["conv"], normal[step]["conv"], rtol=2e-4,
                                   atol=2e-5)


def test_a_gradient_zero_on_every_rank_does_not_stay_zero(rank, size):
    # without error feedback a step where "w" is zero on every rank leaves
    # Q zero; it is drawn afresh, so the next steps compress "w" again
    compression = hvd.Compression.powersgd(start_iter=1, error_feedback=False)
    _, seen = train(rank, 4, compression, poison=(1, None, "w", 0))
    assert np.abs(seen[1]["w"]).max() == 0
    for step in (2, 3):
        assert np.abs(seen[step]["w"]).max() > 0.1
        flat = torch.from_numpy(seen[step]["w"]).reshape(1, -1)
        for other in hvd.allgather(flat, name=f"powersgd.zero.check.{step}"):
            assert torch.equal(other, flat[0])


def test_a_new_world_starts_the_compressor_again(rank, size):
    needs_ranks(size)
    # elastic state's sync() (run when the world changes) resets Q, the
    # errors and the warm-up count on every rank
    compression = hvd.Compression.powersgd(start_iter=1)
    opt, _ = train(rank, 3, compression)
    assert compression.iteration == 3 and compression._state
    hvd.elastic.TorchState(optimizer=opt).sync()
    assert compression.iteration == 0 and not compression._state


# --- the one-bit compressor (signs and a scale, error feedback) -------------

def onebit_reference(size, steps, start_iter, min_elements):
    """Every step's reduced gradients and every rank's errors, simulated
    for all ranks (in float32, summed in rank order as every rank does)."""
    errors, results = {}, []
    for step in range(steps):
        out = {}
        for name, shape in SHAPES.items():
            grads = [gradient(name, k, step).astype(np.float32) for k in range(size)]
            if step < start_iter or int(np.prod(shape)) < min_elements:
                out[name] = np.mean([g.astype(np.float64) for g in grads], axis=0)
                continue
            errors.setdefault(name, [np.zeros(shape, np.float32) for _ in range(size)])
            total = np.zeros(shape, np.float32)
            for k in range(size):
                matrix = grads[k] + errors[name][k]
                scale = np.float32(np.abs(matrix).mean())
                sent = np.where(matrix >= 0, scale, -scale).astype(np.float32)
                errors[name][k] = matrix - sent
                total += sent
            out[name] = total / size
        results.append(out)
    return results, errors


def test_onebit_matches_the_reference_on_every_rank(rank, size):
    needs_ranks(size)
    steps, start_iter, min_elements = 4, 1, 16
    compression = hvd.Compression.onebit(start_iter=start_iter, min_elements=min_elements)
    _, seen = train(rank, steps, compression)
    expected, errors = onebit_reference(size, steps, start_iter, min_elements)
    for step in range(steps):
        for name in SHAPES:
            np.testing.assert_allclose(seen[step][name], expected[step][name], rtol=1e-4,
                                       atol=1e-5, err_msg=f"step {step}, {name}")
    assert set(errors) == {"w", "conv"}
    for name, per_rank in errors.items():
        np.testing.assert_allclose(compression._errors[f"allreduce.{name}"].numpy(),
                                   per_rank[rank], rtol=1e-4, atol=1e-5)
    flat = torch.cat([torch.from_numpy(seen[-1][name]).reshape(-1) for name in SHAPES])
    for other in hvd.allgather(flat.unsqueeze(0), name="onebit.check"):
        assert torch.equal(other, flat)


def test_onebit_overflow_is_handed_on_and_the_errors_start_again(rank, size):
    needs_ranks(size)
    # one rank's gradient of "w" overflows at step 2: every rank gets a
    # non-finite "w" there and starts its errors from zero, so step 3 is
    # the one-bit average of step 3's gradients alone, on every rank
    compression = hvd.Compression.onebit(start_iter=1, min_elements=16)
    _, seen = train(rank, 4, compression, poison=(2, size - 1, "w", float("inf")))
    assert not np.isfinite(seen[2]["w"]).all()
    grads = [gradient("w", k, 3).astype(np.float32) for k in range(size)]
    scales = [np.float32(np.abs(g).mean()) for g in grads]
    expected = sum(np.where(g >= 0, s, -s) for g, s in zip(grads, scales)) / size
    np.testing.assert_allclose(seen[3]["w"], expected, rtol=1e-4, atol=1e-5)
    flat = torch.from_numpy(seen[3]["w"]).reshape(1, -1)
    for other in hvd.allgather(flat, name="onebit.overflow.check"):
        assert torch.equal(other, flat[0])


def test_onebit_signs_pack_and_unpack():
    from hora.torch.onebit import pack_signs, unpack_signs
    values = torch.tensor([0.5, -1.0, 0.0, -0.0, 3.0, -2.0, 1.0, -1.0, 7.0, -7.0, 2.0])
    packed = pack_signs(values)
    assert packed.dtype == torch.uint8 and packed.numel() == 2  # 11 bits
    assert unpack_signs(packed, 11, torch.float32).tolist() == [
        1, -1, 1, 1, 1, -1, 1, -1, 1, -1, 1]


def test_onebit_bad_arguments_raise():
    for kwargs, text in (({"start_iter": -1}, "start_iter must be an int >= 0"),
                         ({"min_elements": 0}, "min_elements must be an int >= 1")):
        with pytest.raises(ValueError, match=text):
            hvd.Compression.onebit(**kwargs)
    net = Net()
    with pytest.raises(ValueError, match="cannot be combined with sharding"):
        hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1),
                                 named_parameters=net.named_parameters(),
                                 compression=hvd.Compression.onebit(), sharding="gradients")
    with pytest.raises(ValueError, match="a single collective takes Compression.none"):
        hvd.allreduce(torch.ones(3), name="onebit.single", compression=hvd.Compression.onebit())
