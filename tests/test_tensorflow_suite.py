"""Runs tests/tf_parallel (hora.tensorflow and hora.keras) under horarun at
world sizes 1, 2 and 3, with Keras 3 (TensorFlow's default), and its Keras 2
tests (and the Keras test of the process sets) with TF_USE_LEGACY_KERAS=1
(tf_keras). The examples are trained by tests/test_docs.py, from the
getting-started pages that walk through them."""

import pathlib

import pytest

from launch import run_horarun

pytest.importorskip("tensorflow")

ROOT = pathlib.Path(__file__).resolve().parent


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_tensorflow_suite(world_size, job_env):
    env = dict(job_env, HORA_STALL_CHECK_TIME_SECONDS="30", HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    output = run_horarun(world_size, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "-o", "faulthandler_timeout=240", str(ROOT / "tf_parallel")],
                     env, ROOT.parent)
    print("\n".join(line for line in output.splitlines() if " passed" in line))


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_keras2_suite(world_size, job_env):
    pytest.importorskip("tf_keras")
    env = dict(job_env, TF_USE_LEGACY_KERAS="1", HORA_STALL_CHECK_TIME_SECONDS="30",
               HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    files = [str(ROOT / "tf_parallel" / name)
             for name in ("test_tf_keras2.py", "test_tf_keras_any.py",
                          "test_tf_process_sets.py::test_keras_distributed_optimizer_in_a_set")]
    output = run_horarun(world_size, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                                      "-o", "faulthandler_timeout=240", *files], env, ROOT.parent)
    summary = [line for line in output.splitlines() if " passed" in line]
    print("\n".join(summary))
    # the Keras 2 tests skip themselves when tf.keras is not Keras 2
    assert summary and not any("skipped" in line for line in summary), output[-5000:]


def test_exact_reduce_gradients(job_env):
    """The gradients of Min, Max and Product with
    HORA_EXACT_REDUCE_GRADIENTS=1 (the suite above checks Horovod's)."""
    env = dict(job_env, HORA_EXACT_REDUCE_GRADIENTS="1", HORA_STALL_CHECK_TIME_SECONDS="30",
               HORA_STALL_SHUTDOWN_TIME_SECONDS="90")
    output = run_horarun(2, ["-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(ROOT / "tf_parallel" / "test_tf_reduce_gradients.py")],
                         env, ROOT.parent)
    print("\n".join(line for line in output.splitlines() if " passed" in line))
