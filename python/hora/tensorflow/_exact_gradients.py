"""With ``HORA_EXACT_REDUCE_GRADIENTS=1``: the gradients of allreduce and
reducescatter with Min, Max and Product that are those of the sum over
ranks of every rank's loss (Horovod's repeat the op on the gradients, or
gather them). The same formulas as :mod:`hora.torch._autograd`'s.

- Min/Max: the summed gradient goes to the ranks holding the chosen value,
  shared equally between ties;
- Product: the summed gradient times the product of the other ranks'
  values;

each times the scale factors (a negative prescale turns a Min into the
largest value's choice, and the other way round).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import tensorflow as tf

from hora.common.basics import Max, Min, Product, Sum
from hora.common.process_sets import ProcessSet, set_rank, set_size


class Collectives(NamedTuple):
    """hora.tensorflow.mpi_ops' collectives that run now (passed in: that
    module calls this one)."""
    allreduce: Callable[..., Any]
    allgather: Callable[..., Any]
    reducescatter: Callable[..., Any]


def _selection(op: Any, prescale: float) -> Any:
    if prescale >= 0:
        return op
    return Max if op == Min else Min


def _product_of_others(x: tf.Tensor, name: str, ps: ProcessSet,
                       now: Collectives) -> tf.Tensor:
    """For each element, the product of the other ranks' values."""
    stacked = now.allgather([tf.expand_dims(x, 0)], [name + ".inputs"], ps)[0]
    mine = tf.reshape(tf.equal(tf.range(set_size(ps)), set_rank(ps)), [-1] + [1] * len(x.shape))
    return tf.reduce_prod(tf.where(mine, tf.ones_like(stacked), stacked), axis=0)


def allreduce_gradients(dys: list[tf.Tensor], xs: list[tf.Tensor], names: list[str], op: Any,
                        prescale: float, postscale: float, ps: ProcessSet,
                        now: Collectives) -> list[tf.Tensor]:
    results = []
    for dy, x, name in zip(dys, xs, names):
        x = tf.convert_to_tensor(x)
        total = now.allreduce([dy], [name + ".sum"], Sum, 1.0, 1.0, False, ps)[0]
        if op == Product:
            others = tf.cast(_product_of_others(x, name, ps, now), dy.dtype)
            results.append(total * others * tf.cast(postscale * prescale ** set_size(ps),
                                                    dy.dtype))
            continue
        chosen = now.allreduce([x], [name + ".chosen"], _selection(op, prescale), 1.0, 1.0,
                               False, ps)[0]
        mask = tf.cast(tf.equal(x, chosen), dy.dtype)
        count = now.allreduce([mask], [name + ".count"], Sum, 1.0, 1.0, False, ps)[0]
        results.append(total * mask / count * tf.cast(prescale * postscale, dy.dtype))
    return results


def reducescatter_gradients(dys: list[tf.Tensor], xs: list[tf.Tensor], names: list[str],
                            op: Any, prescale: float, postscale: float, ps: ProcessSet,
                            now: Collectives) -> list[tf.Tensor]:
    results = []
    for dy, x, name in zip(dys, xs, names):
        x = tf.convert_to_tensor(x)
        if op == Product:
            others = tf.cast(_product_of_others(x, name, ps, now), dy.dtype)
            total = now.allgather([dy], [name + ".grad"], ps)[0]
            results.append(total * others * tf.cast(postscale * prescale ** set_size(ps),
                                                    dy.dtype))
            continue
        chosen_block = now.reducescatter([x], [name + ".chosen"], _selection(op, prescale),
                                         1.0, 1.0, ps)[0]
        chosen = now.allgather([chosen_block], [name + ".chosen_all"], ps)[0]
        mask = tf.cast(tf.equal(x, chosen), dy.dtype)
        count = now.reducescatter([mask], [name + ".count"], Sum, 1.0, 1.0, ps)[0]
        share = now.allgather([dy / count], [name + ".share"], ps)[0]
        results.append(share * mask * tf.cast(prescale * postscale, dy.dtype))
    return results
