"""Gradients of allreduce and reducescatter with Min, Max and Product:
Horovod's by default (the same allreduce of the incoming gradients; the
gathered gradient times the factors), the gradient of the sum of the ranks'
losses with HORA_EXACT_REDUCE_GRADIENTS=1 (tests/test_tensorflow_suite.py
runs this file so too). Each rank's loss is ``sum(out * w_r)``; inputs and
weights come from (test, rank), so every rank computes the expectation."""

import zlib

import numpy as np
import pytest

from conftest import hvd, tf
from hora._loader import _C


def inputs(tag, rank, shape):
    # distinct values on every rank (no ties), away from zero
    rng = np.random.default_rng(zlib.crc32(f"{tag}/{rank}".encode()))
    return (rng.permutation(np.prod(shape)).reshape(shape) + 1 + 100 * rank) / 50.0


def weights(tag, rank, shape):
    return np.random.default_rng(zlib.crc32(f"{tag}/w/{rank}".encode())).normal(size=shape)


REDUCE = {hvd.Min: np.min, hvd.Max: np.max, hvd.Product: np.prod}


@pytest.mark.parametrize("op,pre,post", [(hvd.Min, 1.0, 1.0), (hvd.Max, -2.0, 0.5),
                                         (hvd.Product, 1.5, 1.0)], ids=["Min", "Max", "Product"])
def test_allreduce(op, pre, post, rank, size, mode):
    tag = f"tf.rg.allreduce.{op}"
    xs = [inputs(tag, r, (3, 2)) for r in range(size)]
    ws = [weights(tag, r, (3, 2)) for r in range(size)]
    x = tf.Variable(xs[rank])

    def step():
        with tf.GradientTape() as tape:
            out = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post,
                                name=f"tf.rg.ar.{int(op)}")
            loss = tf.reduce_sum(out * ws[rank])
        return tape.gradient(loss, x)
    grad = mode(step)().numpy()
    stack = np.stack(xs)
    if not _C.exact_reduce_gradients():
        expected = post * REDUCE[op](pre * np.stack(ws), axis=0)
    elif op == hvd.Product:
        others = np.prod(np.delete(stack, rank, axis=0), axis=0)
        expected = sum(ws) * others * post * pre ** size
    else:
        chosen = {hvd.Min: np.min, hvd.Max: np.max}[op if pre >= 0 else
                                                    (hvd.Max if op == hvd.Min else hvd.Min)]
        mask = stack[rank] == chosen(stack, axis=0)
        expected = sum(ws) * mask * pre * post
    np.testing.assert_allclose(grad, expected, rtol=1e-10)


@pytest.mark.parametrize("op", [hvd.Min, hvd.Product], ids=["Min", "Product"])
def test_reducescatter(op, rank, size, mode):
    tag = f"tf.rg.reducescatter.{op}"
    rows = size + 1
    xs = [inputs(tag, r, (rows, 2)) for r in range(size)]
    blocks = [rows // size + (1 if r < rows % size else 0) for r in range(size)]
    ws = [weights(tag, r, (blocks[r], 2)) for r in range(size)]
    x = tf.Variable(xs[rank])

    def step():
        with tf.GradientTape() as tape:
            out = hvd.reducescatter(x, op=op, postscale_factor=2.0, name=f"tf.rg.rs.{int(op)}")
            loss = tf.reduce_sum(out * ws[rank])
        return tape.gradient(loss, x)
    grad = mode(step)().numpy()
    gathered = np.concatenate(ws)
    stack = np.stack(xs)
    if not _C.exact_reduce_gradients():
        expected = gathered * 2.0
    elif op == hvd.Product:
        expected = gathered * np.prod(np.delete(stack, rank, axis=0), axis=0) * 2.0
    else:
        expected = gathered * (stack[rank] == stack.min(axis=0)) * 2.0
    np.testing.assert_allclose(grad, expected, rtol=1e-10)
