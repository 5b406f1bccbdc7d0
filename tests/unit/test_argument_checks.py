"""The argument checks every adapter shares (hora.common._adapter.checks)."""

import re

import numpy as np
import pytest

from hora.common._adapter.checks import check_root


@pytest.mark.parametrize("value", [2, np.int64(2), np.int32(2)])
def test_a_root_rank_of_an_integer_type_is_taken(value):
    assert check_root(value, "broadcast") == 2 and type(check_root(value, "broadcast")) is int


@pytest.mark.parametrize("value", [1.5, 2.0, "1", None, [1]])
def test_a_root_rank_that_is_no_integer_is_refused_as_by_horovod(value):
    expected = re.escape(f"broadcast: root_rank must be an int, got {value!r}")
    with pytest.raises(TypeError, match=expected):
        check_root(value, "broadcast")
