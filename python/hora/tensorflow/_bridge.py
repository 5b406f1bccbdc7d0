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

import collections
import functools
import re
import threading

import numpy as np
import tensorflow as tf

from hora.common._adapter.checks import unsupported_dtype
from hora.common._adapter.naming import auto_name
from hora.common.exceptions import (
    HoraError, HoraInvalidArgumentError, HoraMismatchError)

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
        raise unsupported_dtype(what, tensor.dtype.name, [d.name for d in SUPPORTED_DTYPES])
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
_TF_ERROR_CLASSES: dict[tuple[type, type], type] = {}


def _tf_error_class(error):
    if isinstance(error, tf.errors.OpError):
        return type(error)
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


# In a graph the collective runs in a tf.numpy_function, and TensorFlow
# turns what that raises into an error code by the exception's Python class
# only: ValueError and TypeError give INVALID_ARGUMENT, a few others their
# own codes, everything else UNKNOWN; a tf.errors.OpError raised there loses
# its code as well (TensorFlow 2.21, python/lib/core/py_func.cc). So a mismatch would
# reach the caller of the tf.function (model.fit's step included), or the
# loop over a tf.data.Dataset whose map runs a collective, as
# tf.errors.UnknownError, where Horovod's kernels fail with
# FAILED_PRECONDITION. The node therefore raises the tf.errors class (an
# InvalidArgumentError is a ValueError, so that code survives) and notes
# hora's message and that class here. Where TensorFlow turns a failed status
# into the Python exception of a function call or an op (eager/execute.py)
# or of an iterator step (eager/core.py), an UnknownError or
# InvalidArgumentError whose message holds the node's noted exception (the
# last line of its traceback, class and message) is raised as the noted
# class instead: Horovod's tf.errors class, still hora's class too, with
# TensorFlow's message. Other errors pass through untouched.
_GRAPH_ERRORS: collections.deque[tuple[str, type]] = collections.deque(maxlen=64)
_GRAPH_ERRORS_LOCK = threading.Lock()


def _raising_tf_errors(fn):
    """``fn`` for a numpy_function node: hora's errors leave it as
    ``as_tf_error`` makes them, noted for ``_graph_error``."""
    def node_fn(*arrays):
        try:
            return fn(*arrays)
        except (HoraError, HoraInvalidArgumentError) as error:
            tf_error = as_tf_error(error)
            text = str(error)
            if text:
                with _GRAPH_ERRORS_LOCK:
                    _GRAPH_ERRORS.append((text, type(tf_error)))
            raise tf_error from None
    return node_fn


def _graph_error(exception):
    """``exception`` (what TensorFlow made of a failed status) as the class
    a hora node noted for it, or None when no hora node failed it."""
    if type(exception) not in (tf.errors.UnknownError, tf.errors.InvalidArgumentError):
        return None
    with _GRAPH_ERRORS_LOCK:
        noted = list(_GRAPH_ERRORS)
    message = exception.message
    for text, error_class in reversed(noted):
        # the code TensorFlow gives what the node raised (see above)
        code_class = (tf.errors.InvalidArgumentError
                      if issubclass(error_class, tf.errors.InvalidArgumentError)
                      else tf.errors.UnknownError)
        # the line the node's traceback ends with in TensorFlow's message
        line = f"{error_class.__module__}.{error_class.__qualname__}: {text}"
        if type(exception) is code_class and line in message:
            payloads = exception.experimental_payloads
            return error_class(None, None, message, *((payloads,) if payloads else ()))
    return None


def _translating_call(call):
    """``call`` (a TensorFlow function that runs an op or a function and
    raises its failure) raising a hora node's failure as the noted class."""
    @functools.wraps(call)
    def translated(*args, **kwargs):
        try:
            return call(*args, **kwargs)
        except (tf.errors.UnknownError, tf.errors.InvalidArgumentError) as error:
            replacement = _graph_error(error)
            if replacement is None:
                raise
            raise replacement.with_traceback(error.__traceback__) from None
    translated.hora_translates = True
    return translated


def _translating_conversion(convert):
    """``convert`` (eager/core.py's status-to-exception) returning a hora
    node's failure as the noted class."""
    @functools.wraps(convert)
    def translated(status):
        exception = convert(status)
        return _graph_error(exception) or exception
    translated.hora_translates = True
    return translated


_translation_installed = False


def _install_error_translation():
    """Wraps the private functions of TensorFlow named above (see
    ``_GRAPH_ERRORS``), once, when the first hora node is built (a program
    that never puts a collective in a graph runs TensorFlow untouched); a
    TensorFlow without one of them leaves hora's failures in graphs there as
    UnknownError."""
    global _translation_installed
    if _translation_installed:
        return
    _translation_installed = True
    try:
        from tensorflow.python.eager import core, execute
    except ImportError:  # pragma: no cover - depends on the TensorFlow release
        return
    targets = [(core, "_status_to_exception", _translating_conversion),
               (execute, "quick_execute", _translating_call),
               (execute, "execute_with_cancellation", _translating_call)]
    original_quick = getattr(execute, "quick_execute", None)
    for module, attribute, wrap in targets:
        function = getattr(module, attribute, None)
        if callable(function) and not getattr(function, "hora_translates", False):
            setattr(module, attribute, wrap(function))
    # execute.execute is quick_execute unless op callbacks are registered;
    # their execute_with_callbacks calls the module's quick_execute, wrapped
    # now, and removing them sets execute.execute to it again
    if original_quick is not None and getattr(execute, "execute", None) is original_quick:
        execute.execute = execute.quick_execute



def run(fn, inputs, out_dtypes, out_shapes, name):
    """Calls ``fn`` (NumPy arrays in, a list of NumPy arrays out) on
    ``inputs``: at once when eager, as a graph node inside ``tf.function``.
    Returns a list of tensors with ``out_dtypes`` and (static) ``out_shapes``.
    hora's errors are raised as the ``tf.errors`` classes Horovod raises
    (see ``as_tf_error``): at once when eager; from a graph (a
    ``tf.function``, a ``tf.data`` map) when the function call or the
    iterator step fails, with TensorFlow's message around hora's (see
    ``_GRAPH_ERRORS``)."""
    if tf.executing_eagerly():
        try:
            outputs = fn(*[t.numpy() for t in inputs])
        except (HoraError, HoraInvalidArgumentError) as error:
            raise as_tf_error(error) from None
        return [tf.convert_to_tensor(o, dtype=d) for o, d in zip(outputs, out_dtypes)]
    _refuse_xla(name)
    node_name = _normalize(name).replace("/", "_").replace(".", "_")[:200] or "hora"

    _install_error_translation()
    node_fn = _raising_tf_errors(fn)

    def node(*xs):
        return list(tf.numpy_function(node_fn, list(xs), list(out_dtypes), stateful=True,
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
