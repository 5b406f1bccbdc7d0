"""NumPy references for the collectives, shared by the tests in this folder.

Every rank builds every other rank's input with ``rank_input`` and computes
the expected result of a collective locally, so each rank can assert on its
own output without talking to the others.
"""

import os

import numpy as np

import hora
from conftest import ALL_DTYPES, rank_input, resolve_dtype

HALF_NAMES = ("float16", "bfloat16")
# The floating-point members of ALL_DTYPES (the ones scale factors apply to).
FLOAT_DTYPES = [d for d in ALL_DTYPES if d in (np.float16, "bfloat16", np.float32, np.float64)]

OP_NAMES = {hora.Sum: "Sum", hora.Average: "Average", hora.Min: "Min", hora.Max: "Max",
            hora.Product: "Product"}
ALL_OPS = [hora.Sum, hora.Average, hora.Min, hora.Max, hora.Product]


def dtype_name(dtype):
    """A short, stable name for a dtype of ALL_DTYPES (used in ids and tensor names)."""
    return dtype if isinstance(dtype, str) else np.dtype(dtype).name


def op_name(op):
    return OP_NAMES[op]


def is_half(dtype):
    return resolve_dtype(dtype).name in HALF_NAMES


def is_float(dtype):
    d = resolve_dtype(dtype)
    return d.name in HALF_NAMES or np.issubdtype(d, np.floating)


def is_bool(dtype):
    return resolve_dtype(dtype) == np.bool_


def eps(dtype):
    """Machine epsilon of a floating-point dtype (bfloat16 included)."""
    d = resolve_dtype(dtype)
    if d.name == "bfloat16":
        import ml_dtypes
        return float(ml_dtypes.finfo(d).eps)
    return float(np.finfo(d).eps)


def inputs_of(tag, ranks, shape, dtype):
    """Every listed rank's input for ``tag``."""
    return [rank_input(tag, r, shape, dtype) for r in ranks]


def _trunc_divide(values, divisor):
    # C-style integer division: the quotient is truncated toward zero.
    return np.sign(values) * (np.abs(values) // divisor)


def reduce_reference(arrays, op, dtype, prescale=1.0, postscale=1.0, divisor=None):
    """The reduction of ``arrays`` (one per contributing rank) as hora defines it.
    An Average divides by ``divisor`` (default: the number of arrays; the
    world size while ranks have joined).

    Integers reduce exactly and Average truncates toward zero; scaled
    integers are scaled as Horovod scales them: each input times prescale in
    float64, truncated, then reduced, then times postscale (divided by n for
    Average) in float64 and truncated; bool Sum/Max
    is logical or and Min/Product logical and; float16 and bfloat16 are
    widened to float32, reduced and rounded once. Floating-point references
    are computed in float64 (or float32 for the half types) and cast at the
    end, so they are exact whenever the true result is representable.
    """
    dtype = resolve_dtype(dtype)
    n = len(arrays) if divisor is None else divisor
    assert len(arrays) > 0
    stack = np.stack([np.asarray(a) for a in arrays])
    if dtype == np.bool_:
        if op in (hora.Sum, hora.Max):
            return np.logical_or.reduce(stack, axis=0)
        if op in (hora.Min, hora.Product):
            return np.logical_and.reduce(stack, axis=0)
        raise ValueError(f"no bool reference for {op!r}")
    if np.issubdtype(dtype, np.integer):
        scaled = prescale != 1.0 or postscale != 1.0
        wide = stack.astype(np.int64)
        if prescale != 1.0:
            wide = np.trunc(stack.astype(np.float64) * prescale).astype(np.int64)
        if scaled and op in (hora.Sum, hora.Average):
            factor = postscale / n if op == hora.Average else postscale
            return np.trunc(wide.sum(axis=0) * factor).astype(np.int64).astype(dtype)
        if op == hora.Sum:
            result = wide.sum(axis=0)
        elif op == hora.Average:
            result = _trunc_divide(wide.sum(axis=0), n)
        elif op == hora.Min:
            result = wide.min(axis=0)
        elif op == hora.Max:
            result = wide.max(axis=0)
        elif op == hora.Product:
            result = wide.prod(axis=0)
        else:
            raise ValueError(f"no integer reference for {op!r}")
        if postscale != 1.0:
            result = np.trunc(result * postscale)
        return np.asarray(result).astype(np.int64).astype(dtype)
    work = np.float32 if dtype.name in HALF_NAMES else np.float64
    wide = stack.astype(work) * work(prescale)
    if op in (hora.Sum, hora.Average):
        result = wide.sum(axis=0)
        if op == hora.Average:
            result = result / work(n)
    elif op == hora.Min:
        result = wide.min(axis=0)
    elif op == hora.Max:
        result = wide.max(axis=0)
    elif op == hora.Product:
        result = wide.prod(axis=0)
    else:
        raise ValueError(f"no float reference for {op!r}")
    result = np.asarray(result * work(postscale), dtype=work)
    return result.astype(dtype)


def reducescatter_rows(rows, size):
    """Rows each rank gets from a reducescatter: the first rows % size ranks
    get one extra."""
    return [rows // size + (1 if k < rows % size else 0) for k in range(size)]


def reducescatter_block(full, rank, size):
    """This rank's block of the fully reduced array ``full``."""
    counts = reducescatter_rows(full.shape[0], size)
    start = sum(counts[:rank])
    return full[start:start + counts[rank]]


def _as_f64(array):
    return np.asarray(array).astype(np.float64)


def assert_same(actual, expected):
    """``actual`` is an ndarray with exactly ``expected``'s dtype, shape and values."""
    expected = np.asarray(expected)
    assert isinstance(actual, np.ndarray), f"expected an ndarray, got {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != expected {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    if expected.dtype == np.bool_ or np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_array_equal(_as_f64(actual), _as_f64(expected))


def assert_close(actual, expected, ulps=1.0, magnitude=0.0):
    """Like :func:`assert_same`, but floating-point values may differ by
    ``ulps`` units of the dtype's epsilon, relative to the value (and to
    ``magnitude`` for results that are near zero after cancellation)."""
    expected = np.asarray(expected)
    assert isinstance(actual, np.ndarray), f"expected an ndarray, got {type(actual).__name__}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != expected {expected.dtype}"
    assert actual.shape == expected.shape, f"shape {actual.shape} != expected {expected.shape}"
    tolerance = ulps * eps(expected.dtype)
    np.testing.assert_allclose(_as_f64(actual), _as_f64(expected), rtol=tolerance,
                               atol=tolerance * magnitude)


# On the ring between hosts (forced here by HORA_ALLREDUCE_ALGORITHM=ring)
# half types travel as halves and each hop rounds its partial sum, as
# Horovod's float16 MPI sum and NCCL do; an Average divides each input
# first. Elsewhere halves are reduced in float32.
HALVES_TRAVEL = os.environ.get("HORA_ALLREDUCE_ALGORITHM") == "ring"


def assert_reduced(actual, expected, op):
    """Exact for everything except a floating-point Average, whose division
    may be done as a multiplication by 1/n (one rounding step apart), and
    sums and averages of half types on the ring, rounded at every hop: a
    few units of the half's epsilon, relative to the largest result (a
    partial sum may be larger than a result near zero)."""
    floating = expected.dtype != np.bool_ and not np.issubdtype(expected.dtype, np.integer)
    if (HALVES_TRAVEL and floating and expected.dtype.itemsize == 2
            and op in (hora.Sum, hora.Average)):
        magnitude = float(np.max(np.abs(_as_f64(expected)))) if expected.size else 0.0
        assert_close(actual, expected, ulps=4.0, magnitude=max(magnitude, 1.0))
    elif op == hora.Average and floating:
        assert_close(actual, expected, ulps=1.0)
    else:
        assert_same(actual, expected)
