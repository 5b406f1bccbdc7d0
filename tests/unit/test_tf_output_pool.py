"""hora.tensorflow's pool of result arrays: aligned so that TensorFlow uses
them without a copy, handed out again only once nothing else refers to
them."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from hora.tensorflow._outputs import ALIGNMENT, OutputPool, aligned_empty  # noqa: E402


@pytest.mark.parametrize("shape,dtype", [((3,), np.float32), ((7, 5), np.float64),
                                         ((1000, 33), np.int8), ((0,), np.float16)])
def test_arrays_are_aligned_and_contiguous(shape, dtype):
    array = aligned_empty(shape, dtype)
    assert array.shape == shape and array.dtype == dtype and array.flags.c_contiguous
    assert array.flags.writeable and (array.size == 0 or array.ctypes.data % ALIGNMENT == 0)


def test_an_array_comes_back_only_when_nobody_holds_it():
    pool = OutputPool(per_slot=2)
    x = np.zeros((4, 4), np.float32)
    first = pool.like("a", x)
    second = pool.like("a", x)  # `first` is held here
    assert second is not first
    del first
    again = pool.like("a", x)
    assert again is not second and again.shape == x.shape
    # other slots and shapes have arrays of their own
    assert pool.like("b", x) is not again
    assert pool.like("a", np.zeros(3, np.float32)).shape == (3,)


def test_a_full_slot_hands_out_new_arrays_without_keeping_them():
    pool = OutputPool(per_slot=1)
    x = np.zeros(8, np.float64)
    held = [pool.like("s", x) for _ in range(3)]
    assert len({id(a) for a in held}) == 3
    del held
    assert len(pool._arrays[("s", (8,), x.dtype.str)]) == 1


def test_an_array_under_a_live_tensor_is_not_reused():
    """TensorFlow builds a tensor on an aligned array without copying it
    and holds a reference; until the tensor is gone the array stays taken."""
    pool = OutputPool()
    x = np.zeros(1 << 16, np.float32)
    handed = [pool.like("t", x)]
    handed[0][:] = 7.0

    @tf.function
    def through(value):
        # gives the array to TensorFlow and keeps no reference to it
        return tf.numpy_function(lambda v: handed.pop(), [value], tf.float32, stateful=True)

    tensor = through(tf.constant(x))
    assert not handed
    fresh = pool.like("t", x)
    fresh[:] = -1.0
    assert float(tf.reduce_min(tensor)) == 7.0  # the tensor's data was not handed out again
