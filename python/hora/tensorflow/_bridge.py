"""Runs hora's NumPy collectives on TensorFlow tensors.

In eager mode a collective runs at once on the tensors' NumPy views. Inside
``tf.function`` (the default of ``model.fit``) it becomes one stateful
``tf.numpy_function`` node: TensorFlow runs the stateful nodes of a function
in program order, so every rank submits its collectives in the same order,
and a node blocks only its own thread while the engine works. A whole
gradient list travels through one node, so its tensors are submitted
together and fused.

Names: a collective without a user-given name is matched across ranks by
call order in eager mode; in a graph it is named after the tensor it reduces
(unique within the graph, as TensorFlow names nodes), so retracing on one
rank does not shift the names of the others.
"""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from hora.common._adapter.naming import auto_name

SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.int16, tf.int32, tf.int64, tf.float16, tf.bfloat16,
                    tf.float32, tf.float64, tf.bool)


def check_tensor(tensor, what):
    """``tensor`` as a ``tf.Tensor`` of a dtype the core reduces."""
    if isinstance(tensor, tf.IndexedSlices):
        raise TypeError(f"{what}: tf.IndexedSlices are not supported here; convert with "
                        f"tf.convert_to_tensor first")
    try:
        tensor = tf.convert_to_tensor(tensor)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{what}: cannot make a tensor of {type(tensor).__name__}: {error}") \
            from None
    if tensor.dtype not in SUPPORTED_DTYPES:
        names = ", ".join(d.name for d in SUPPORTED_DTYPES)
        raise TypeError(f"{what}: dtype {tensor.dtype.name} is not supported; supported dtypes "
                        f"are {names}")
    return tensor


def check_tensors(tensors, what):
    if isinstance(tensors, (tf.Tensor, tf.Variable, np.ndarray)):
        raise TypeError(f"{what}: expected a list of tensors, got a single tensor")
    return [check_tensor(t, f"{what} (tensor {i})") for i, t in enumerate(tensors)]


def _normalize(text):
    return re.sub(r"[^A-Za-z0-9_./-]", "_", text)


def collective_name(name, kind, tensor=None):
    """The name a collective is matched by across ranks (see the module
    docstring). ``kind`` is a CamelCase word such as ``Allreduce``."""
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"{kind.lower()}: name must be a str, got {type(name).__name__}")
        return name
    if tf.executing_eagerly():
        return auto_name(kind.lower())
    base = f"Hora{kind}"
    if tensor is not None:
        base += "_" + _normalize(tensor.name.split(":")[0])
    return tf.compat.v1.get_default_graph().unique_name(base)


def _refuse_xla(name):
    try:
        from tensorflow.python.ops import control_flow_util
        in_xla = control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())
    except (ImportError, AttributeError):  # pragma: no cover - private API moved
        return
    if in_xla:
        raise RuntimeError(
            f"'{name}': hora's collectives run on the host and cannot be compiled by XLA; "
            f"use model.compile(..., jit_compile=False) or tf.function(jit_compile=False)")


def run(fn, inputs, out_dtypes, out_shapes, name):
    """Calls ``fn`` (NumPy arrays in, a list of NumPy arrays out) on
    ``inputs``: at once when eager, as a graph node inside ``tf.function``.
    Returns a list of tensors with ``out_dtypes`` and (static) ``out_shapes``."""
    if tf.executing_eagerly():
        outputs = fn(*[t.numpy() for t in inputs])
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outputs, out_dtypes)]
    _refuse_xla(name)
    node_name = _normalize(name).replace("/", "_").replace(".", "_")[:200] or "hora"
    outputs = tf.numpy_function(fn, list(inputs), list(out_dtypes), stateful=True, name=node_name)
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    for output, shape in zip(outputs, out_shapes):
        output.set_shape(shape)
    return list(outputs)


def gathered_shape(shape):
    """Static shape of an allgather/reducescatter result: first dimension unknown."""
    shape = tf.TensorShape(shape)
    if shape.rank is None:
        return shape
    return tf.TensorShape([None]).concatenate(shape[1:])
