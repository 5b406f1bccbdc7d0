"""The gradient policy every framework adapter shares: gradients are grouped
the way Horovod groups them, and the same mistake is worded the same way by
torch's and Keras's DistributedOptimizer and TensorFlow's
DistributedGradientTape (tests/mx_parallel checks MXNet's wording against
the same sentences). Single-process: nothing here starts hora."""

import re
import warnings

import numpy as np
import pytest

from hora.common import gradient_policy as policy
from hora.common.basics import Adasum, Average, Max, Sum


def horovod_blocks(items, count):
    """Horovod's split_list as its docstring and arithmetic describe it:
    ``count`` blocks, the first ``len % count`` one item longer; the empty
    blocks it makes when ``count`` exceeds the items are left out here."""
    length, longer = divmod(len(items), count)
    blocks = [items[i * length + min(i, longer):(i + 1) * length + min(i + 1, longer)]
              for i in range(count)]
    return [list(b) for b in blocks if b]


@pytest.mark.parametrize("total", range(0, 13))
@pytest.mark.parametrize("count", range(1, 15))
def test_int_groups_are_horovods_contiguous_blocks(total, count):
    items = [f"g{i}" for i in range(total)]
    assert policy.split_evenly(items, count) == horovod_blocks(items, count)
    units = policy.group_units(list(range(total)), count)
    assert units == horovod_blocks(list(range(total)), count)
    # contiguous, in order, every gradient once: never round-robin
    assert [i for unit in units for i in unit] == list(range(total))


def test_ten_gradients_in_three_groups():
    assert policy.group_units(list(range(10)), 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_list_groups_come_first_and_the_rest_go_alone():
    a, b, c, d, e = (object() for _ in range(5))
    keys = [id(x) for x in (a, b, c, d, e)]
    # members in the gradients' order whatever order they are listed in; an
    # empty group and entries that are not among the gradients drop out
    units = policy.group_units(keys, [[d, b], [], [object()], [a]])
    assert units == [[1, 3], [0], [2], [4]]
    assert policy.group_units(keys, None) == [[0], [1], [2], [3], [4]]


def test_policy_scales_and_defaults():
    average = policy.gradient_policy("X", gradient_predivide_factor=4.0, groups=2)
    assert (average.op, average.prescale, average.postscale) == (Average, 0.25, 4.0)
    assert average.groups == 2
    plain_sum = policy.gradient_policy("X", op=Sum, groups=None)
    assert (plain_sum.prescale, plain_sum.postscale, plain_sum.groups) == (1.0, 1.0, None)


def test_num_groups_is_deprecated_and_groups_wins_as_in_horovod():
    with pytest.warns(DeprecationWarning, match="X: num_groups is deprecated"):
        assert policy.gradient_policy("X", num_groups=3).groups == 3
    with pytest.warns(DeprecationWarning):
        assert policy.gradient_policy("X", groups=2, num_groups=3).groups == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # MXNet's only spelling: no warning
        assert policy.gradient_policy("X", num_groups=3, num_groups_deprecated=False).groups == 3


# The mistakes and the words every framework uses for them, after "<call>: ".
MISTAKES = {
    "adasum_predivide": (dict(op=Adasum, gradient_predivide_factor=2.0),
                         "gradient_predivide_factor is only supported with op=Average, "
                         "got op=Adasum"),
    "max": (dict(op=Max), "op must be Average, Sum or Adasum, got Max"),
    "predivide_with_sum": (dict(op=Sum, gradient_predivide_factor=2.0),
                           "gradient_predivide_factor is only supported with op=Average, "
                           "got op=Sum"),
    "predivide_zero": (dict(gradient_predivide_factor=0),
                       "gradient_predivide_factor must be positive, got 0.0"),
    "negative_groups": (dict(groups=-1), "the number of groups must not be negative, got -1"),
    "bad_compression": (dict(compression=object),
                        "compression must be one of the framework's Compression members "
                        "(Compression.none, Compression.fp16, ...) or a class with compress and "
                        "decompress, got <class 'object'>"),
}


def message(call):
    with pytest.raises((ValueError, TypeError)) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_policy_words(mistake):
    kwargs, words = MISTAKES[mistake]
    assert message(lambda: policy.gradient_policy("Some call", **kwargs)) == f"Some call: {words}"


@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_torch_tensorflow_and_keras_word_a_mistake_alike(mistake):
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")
    import hora.tensorflow as hvd_tf
    import hora.torch as hvd_torch
    kwargs, words = MISTAKES[mistake]
    model = torch.nn.Linear(2, 1)
    with tf.GradientTape() as tape:
        pass
    seen = {
        "torch": message(lambda: hvd_torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), **kwargs)),
        "tape": message(lambda: hvd_tf.DistributedGradientTape(tape, **kwargs)),
        "keras": message(lambda: hvd_tf.DistributedOptimizer(keras.optimizers.SGD(), **kwargs)),
    }
    assert seen == {"torch": f"DistributedOptimizer: {words}",
                    "tape": f"DistributedGradientTape: {words}",
                    "keras": f"DistributedOptimizer: {words}"}


def test_backward_passes_are_checked_alike():
    torch = pytest.importorskip("torch")
    keras = pytest.importorskip("keras")
    import hora.tensorflow as hvd_tf
    import hora.torch as hvd_torch
    model = torch.nn.Linear(2, 1)
    words = "DistributedOptimizer: backward_passes_per_step must be at least 1 (an int), got 0"
    assert message(lambda: hvd_torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), backward_passes_per_step=0)) == words
    assert message(lambda: hvd_tf.DistributedOptimizer(
        keras.optimizers.SGD(), backward_passes_per_step=0)) == words


def test_torch_optimizer_groups_parameters_as_horovod_does():
    torch = pytest.importorskip("torch")
    import hora.torch as hvd_torch
    model = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(5)])  # 10 parameters
    params = list(model.parameters())
    position = {id(p): i for i, p in enumerate(params)}

    def units(optimizer):
        return [[position[id(p)] for p in unit] for unit in optimizer._hora_units]

    optimizer = hvd_torch.DistributedOptimizer(torch.optim.SGD(params, lr=0.1), groups=3)
    assert units(optimizer) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    explicit = hvd_torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                              groups=[[params[5], params[2]]])
    assert units(explicit) == [[2, 5], [0], [1], [3], [4], [6], [7], [8], [9]]


def test_tensorflow_groups_every_present_gradient_as_horovod_does():
    tf = pytest.importorskip("tensorflow")
    from hora.tensorflow.gradients import GradientReducer
    dense = tf.zeros([2])
    sparse = tf.IndexedSlices(tf.zeros([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    grads = [dense, sparse, dense, None, dense]
    # Horovod splits the gradients that are not None, sparse ones included
    assert GradientReducer(groups=2).units(grads) == [[0, 1], [2, 4]]
    assert GradientReducer().units(grads) == [[0], [1], [2], [4]]
    variables = [tf.Variable(np.zeros(2, np.float32)) for _ in grads]
    reducer = GradientReducer(groups=[[variables[4], variables[0]]])
    assert reducer.units(grads, variables) == [[0, 4], [1], [2]]
    with pytest.raises(ValueError, match=re.escape("need the variables")):
        reducer.units(grads)


MIB = 1 << 20


def test_buckets_walk_backwards_with_a_small_first_bucket():
    from hora.common.gradient_policy import bucket_units
    half = [MIB // 2] * 6
    assert bucket_units(half, ["f"] * 6, 2 * MIB) == [[5, 4], [3, 2, 1, 0]]
    assert bucket_units(half, ["f"] * 6, 0) == [[i] for i in range(6)]
    # a gradient larger than a bucket is a bucket of its own
    assert bucket_units([100, 3 * MIB, 100], ["f"] * 3, MIB) == [[2], [1], [0]]
    # buckets smaller than the first bucket's cap keep their own size
    assert bucket_units([40] * 5, ["f"] * 5, 100) == [[4, 3], [2, 1], [0]]
    # the first bucket closes with the gradient that fills it: a large last
    # layer (an output projection) goes out with it, not with the layers
    # whose gradients come later
    layers = [4 * MIB] * 3 + [8 * MIB, 100]
    assert bucket_units(layers, ["f"] * 5, 25 * MIB) == [[4, 3], [2, 1, 0]]


def test_buckets_hold_one_kind_of_gradient():
    from hora.common.gradient_policy import bucket_units
    kinds = ["float32", "float64", "float32", "float64", "float32"]
    assert bucket_units([8] * 5, kinds, 16) == [[4, 2], [3, 1], [0]]


def test_torch_optimizer_buckets_by_default_and_names_buckets_by_their_parameters():
    torch = pytest.importorskip("torch")
    import hora.torch as hvd_torch
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double(),
                                torch.nn.Linear(2, 2))
    params = list(model.parameters())
    position = {id(p): i for i, p in enumerate(params)}

    def units(optimizer):
        return [[position[id(p)] for p in unit] for unit in optimizer._hora_units]

    optimizer = hvd_torch.DistributedOptimizer(torch.optim.SGD(params, lr=0.1),
                                               named_parameters=model.named_parameters())
    assert units(optimizer) == [[5, 4, 1, 0], [3, 2]]
    assert optimizer._hora_unit_names == ["allreduce.bucket.2.bias..0.weight.4",
                                          "allreduce.bucket.1.bias..1.weight.2"]
    alone = hvd_torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           bucket_bytes=0)
    assert units(alone) == [[i] for i in range(6)]
    assert alone._hora_unit_names == [None] * 6
    with pytest.raises(ValueError, match="bucket_bytes must be an int >= 0, got -1"):
        hvd_torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       bucket_bytes=-1)
