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
from hora.common.exceptions import (
    HoraError, HoraInvalidArgumentError, HoraMismatchError, HoraTypeError)

def unconverted(fn):
    """Marks a function that builds a collective's graph node for AutoGraph
    to leave as written.

    Inside the user's ``tf.function`` AutoGraph converts what the user's
    code calls, hora's functions included, and with them the Python
    function they hand to ``tf.numpy_function``, which then ran every step
    through AutoGraph's operators (each ``for`` loop a ``for_stmt`` call per
    iteration): averaging ResNet-20's 65 gradients took 10 ms instead of
    3.1 ms. The functions marked here only take tensors and names, so
    nothing in them needs converting; the public functions around them stay
    convertible, and so does what they call of the user's (a custom
    compressor, say), as in Horovod."""
    return tf.autograph.experimental.do_not_convert(fn)


SUPPORTED_DTYPES = (tf.uint8, tf.int8, tf.uint16, tf.int16, tf.int32, tf.int64, tf.float16,
                    tf.bfloat16, tf.float32, tf.float64, tf.bool)


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
        raise HoraTypeError(f"{what}: dtype {tensor.dtype.name} is not supported; supported "
                            f"dtypes are {names}")
    return tensor


def check_tensors(tensors, what):
    if isinstance(tensors, (tf.Tensor, tf.Variable, np.ndarray)):
        raise TypeError(f"{what}: expected a list of tensors, got a single tensor")
    return [check_tensor(t, f"{what} (tensor {i})") for i, t in enumerate(tensors)]


def _normalize(text):
    return re.sub(r"[^A-Za-z0-9_./-]", "_", text)


def grad_names(names):
    """Names of the collectives of a backward pass: the forward's plus
    ``.grad`` eagerly (one backward runs at a time), unique within the graph
    otherwise, since a graph may differentiate one collective twice and run
    both backward passes at once."""
    if tf.executing_eagerly():
        return [n + ".grad" for n in names]
    base = tf.compat.v1.get_default_graph().unique_name(_normalize(names[0]) + "_grad")
    return [f"{base}.{i}" for i in range(len(names))] if len(names) > 1 else [base]


def collective_name(name, kind, tensor=None, process_set_id=0):
    """The name a collective is matched by across ranks (see the module
    docstring). ``kind`` is a CamelCase word such as ``Allreduce``; eagerly,
    each process set (``process_set_id``) counts its unnamed calls itself,
    since only its members make them."""
    if name is not None:
        if not isinstance(name, str):
            raise TypeError(f"{kind.lower()}: name must be a str, got {type(name).__name__}")
        return name
    if tf.executing_eagerly():
        return auto_name(kind.lower(), process_set_id)
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


# hora's errors as the tf.errors class Horovod's kernels raise for the same
# failure, each still an instance of hora's class (and so of RuntimeError or
# ValueError): ranks that disagree -> FailedPreconditionError, bad arguments
# -> InvalidArgumentError, anything else (a lost peer, shutdown) -> UnknownError.
_TF_ERROR_CLASSES = {}


def _tf_error_class(error):
    if isinstance(error, HoraMismatchError):
        tf_class = tf.errors.FailedPreconditionError
    elif isinstance(error, HoraInvalidArgumentError):
        tf_class = tf.errors.InvalidArgumentError
    else:
        tf_class = tf.errors.UnknownError
    key = (tf_class, type(error))
    if key not in _TF_ERROR_CLASSES:
        _TF_ERROR_CLASSES[key] = type(tf_class.__name__, (tf_class, type(error)),
                                      {"__module__": __name__})
    return _TF_ERROR_CLASSES[key]


def as_tf_error(error):
    """``error`` (a hora error) as the matching ``tf.errors.OpError``."""
    return _tf_error_class(error)(None, None, str(error))


def run(fn, inputs, out_dtypes, out_shapes, name):
    """Calls ``fn`` (NumPy arrays in, a list of NumPy arrays out) on
    ``inputs``: at once when eager, as a graph node inside ``tf.function``.
    Returns a list of tensors with ``out_dtypes`` and (static) ``out_shapes``.
    Eagerly, hora's errors are raised as the ``tf.errors`` classes Horovod
    raises (see ``as_tf_error``); in a graph TensorFlow maps them itself
    (``InvalidArgumentError`` for argument errors, ``UnknownError`` with
    hora's message for the others)."""
    if tf.executing_eagerly():
        try:
            outputs = fn(*[t.numpy() for t in inputs])
        except (HoraError, HoraInvalidArgumentError) as error:
            raise as_tf_error(error) from None
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outputs, out_dtypes)]
    _refuse_xla(name)
    node_name = _normalize(name).replace("/", "_").replace(".", "_")[:200] or "hora"

    def node(*xs):
        return list(tf.numpy_function(fn, list(xs), list(out_dtypes), stateful=True,
                                      name=node_name))

    if tf.compat.v1.get_default_graph().building_function:
        outputs = node(*inputs)
    else:
        outputs = _run_in_session_graph(node, inputs, node_name)
    for output, shape in zip(outputs, out_shapes):
        output.set_shape(shape)
    return list(outputs)


def _run_in_session_graph(node, inputs, node_name):
    """The collective as a node of a TF1-style graph run by a Session.

    A Session runs independent nodes in any order on a small pool of
    threads (one per core), so ranks may start a graph's collectives in
    different orders, and a numpy_function node blocks its thread until its
    collective completes: with more collectives than threads, every thread
    can end up waiting for one that another rank has not started, which
    itself waits for a thread. Horovod's kernels are asynchronous instead.
    Here the node is a one-element tf.data pipeline: its kernel is
    asynchronous and runs the function on a thread of its own (with
    ``use_inter_op_parallelism=False``, the function's body stays on that
    thread), so a waiting collective never holds one of the Session's
    threads and any number of them can be in flight together."""
    try:
        from tensorflow.python.data.ops import map_op
    except ImportError:  # pragma: no cover - a TensorFlow that moved it
        return node(*inputs)
    with tf.name_scope(node_name):
        data = tf.data.Dataset.from_tensors(tuple(inputs))
        data = map_op._MapDataset(data, lambda *xs: tuple(node(*xs)),
                                  use_inter_op_parallelism=False)
        return list(data.get_single_element())


def gathered_shape(shape):
    """Static shape of an allgather/reducescatter result: first dimension unknown."""
    shape = tf.TensorShape(shape)
    if shape.rank is None:
        return shape
    return tf.TensorShape([None]).concatenate(shape[1:])
