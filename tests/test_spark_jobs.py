"""hora.spark against a real local Spark: run() with 2 and 3 ranks, where the
ranks live, the failures (a rank that raises, a task that dies, tasks that
cannot all start), and the Torch estimator on a DataFrame."""
import os
import shutil
import signal
import sys
import time

import pytest

from cluster_procs import ancestors_cmdlines, assert_no_job_processes

if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Java is not installed: Spark needs a JVM", allow_module_level=True)
pytest.importorskip("pyspark", reason="pyspark is not installed (pip install hora[spark])")
import cloudpickle  # noqa: E402

import cluster_procs  # noqa: E402
import hora.spark  # noqa: E402

# The ranks cannot import this test module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(cluster_procs)

SLOTS = 3


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    session = (SparkSession.builder.master(f"local[{SLOTS}]").appName("hora-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _collectives(scale):
    import torch

    import hora.torch as hvd
    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    gathered = hvd.allgather(torch.tensor([hvd.rank() * scale]))
    torch.manual_seed(hvd.rank())  # different starting points on purpose
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for step in range(3):
        x = torch.full((8, 4), float(hvd.rank() + step))
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    weights = hvd.allgather_object(model.weight.detach().flatten().tolist())
    return {"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
            "sum": total.item(), "gathered": gathered.tolist(), "weights": weights}


@pytest.mark.parametrize("num_proc", [2, 3])
def test_run_returns_every_rank_result_in_rank_order(spark, num_proc):
    results = hora.spark.run(_collectives, args=(10,), num_proc=num_proc, verbose=0)
    assert [r["rank"] for r in results] == list(range(num_proc))
    for r in results:
        assert r["size"] == num_proc
        assert r["sum"] == sum(range(1, num_proc + 1))
        assert r["gathered"] == [10 * i for i in range(num_proc)]
        # after three DistributedOptimizer steps every replica is the same
        assert all(w == r["weights"][0] for w in r["weights"])
    assert sorted(r["local_rank"] for r in results) == list(range(num_proc))
    assert_no_job_processes()


def test_num_proc_defaults_to_the_default_parallelism_and_kwargs_arrive(spark):
    def fn(a, b=0):
        return (int(os.environ["HORA_RANK"]), a + b, os.environ.get("TEST_VALUE_FOR_RANKS"))
    # a name horarun would not pass on by itself
    results = hora.spark.run(fn, args=(1,), kwargs={"b": 2}, env={"TEST_VALUE_FOR_RANKS": "x"},
                             verbose=0)
    assert results == [(rank, 3, "x") for rank in range(spark.sparkContext.defaultParallelism)]


def test_horovods_arguments_in_horovods_order(spark):
    import io
    import sys

    def fn(a):
        print(f"rank says {a}")
        return os.environ["HORA_RANK"]
    out = io.StringIO()
    # fn, args, kwargs, num_proc, start_timeout, use_mpi, use_gloo, extra_mpi_args, env,
    # stdout, stderr, verbose, nics, prefix_output_with_timestamp, executable
    results = hora.spark.run(fn, (5,), {}, 2, 120, True, None, None, None, out, None, 0, None,
                             True, sys.executable)
    assert results == ["0", "1"]
    lines = [line for line in out.getvalue().splitlines() if "rank says 5" in line]
    # "Sun Nov 29 20:31:02 2026 [0] rank says 5"
    assert len(lines) == 2 and all(len(line.split(" [")[0].split()) == 5 for line in lines), \
        out.getvalue()
    with pytest.raises(ValueError, match="hora has no Gloo controller"):
        hora.spark.run(fn, (5,), num_proc=2, use_gloo=True)


def test_ranks_run_inside_spark_tasks_not_under_the_driver(spark):
    chains = hora.spark.run(ancestors_cmdlines, num_proc=2, verbose=0)
    for chain in chains:
        # rank -> horarun's rank wrapper -> mpirun's daemon -> ... -> Spark's Python worker
        assert any("prted" in line for line in chain), chain
        assert any("pyspark" in line for line in chain), chain
        assert not any("hora.runner -np" in line for line in chain), chain


def _raise_on_rank_one():
    import torch

    import hora.torch as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise ValueError("bad batch on rank one")
    hvd.allreduce(torch.ones(1), name="never.completes")
    return hvd.rank()


def test_a_rank_that_raises_ends_run_with_its_rank_host_and_traceback(spark):
    started = time.monotonic()
    with pytest.raises(hora.spark.JobError) as info:
        hora.spark.run(_raise_on_rank_one, num_proc=2, verbose=0)
    assert time.monotonic() - started < 60
    error = info.value
    assert error.rank == 1 and error.host
    assert error.error_type == "ValueError"
    assert "rank 1" in str(error) and "ValueError: bad batch on rank one" in str(error)
    assert "_raise_on_rank_one" in error.remote_traceback
    assert_no_job_processes()
    # the context is still good for the next job
    assert hora.spark.run(lambda: 7, num_proc=2, verbose=0) == [7, 7]


def _kill_my_spark_worker():
    import hora.torch as hvd
    hvd.init()
    if hvd.rank() == 0:
        pid = os.getpid()
        while pid > 1:
            with open(f"/proc/{pid}/stat", "rb") as f:
                pid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"pyspark" in f.read():
                    os.kill(pid, signal.SIGKILL)
                    break
    time.sleep(120)


def test_a_task_that_dies_ends_run_naming_the_spark_failure(spark):
    started = time.monotonic()
    with pytest.raises(hora.spark.JobError) as info:
        hora.spark.run(_kill_my_spark_worker, num_proc=2, verbose=0)
    assert time.monotonic() - started < 60
    assert "Spark task failed" in str(info.value)
    assert "Python worker exited unexpectedly" in str(info.value)
    assert_no_job_processes()
    assert hora.spark.run(lambda: 1, num_proc=2, verbose=0) == [1, 1]


def test_tasks_that_cannot_all_start_time_out_with_the_missing_ones_named(spark):
    with pytest.raises(hora.spark.JobError) as info:
        hora.spark.run(lambda: 1, num_proc=SLOTS + 1, start_timeout=4, verbose=0)
    message = str(info.value)
    assert f"only {SLOTS} of {SLOTS + 1} Spark tasks started within 4 s" in message
    assert f"tasks [{SLOTS}] did not" in message
    assert_no_job_processes()
    # the stuck Spark job was cancelled: the slots are free again
    assert hora.spark.run(lambda: 2, num_proc=SLOTS, verbose=0) == [2] * SLOTS


def test_torch_estimator_trains_on_a_dataframe_and_transforms_it(spark, tmp_path, capfd):
    torch = pytest.importorskip("torch")
    datasets = pytest.importorskip("sklearn.datasets")
    import numpy as np

    from hora.spark.common.store import LocalStore
    from hora.spark.torch import TorchEstimator, TorchModel
    digits = datasets.load_digits()
    rows = [((x / 16.0).tolist(), int(y)) for x, y in zip(digits.data, digits.target)]
    df = spark.createDataFrame(rows, ["features", "label"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 10))
    store = LocalStore(str(tmp_path / "store"))
    estimator = TorchEstimator(
        num_proc=2, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1,
                                                           momentum=0.9),
        loss=torch.nn.functional.cross_entropy, feature_cols=["features"],
        label_cols=["label"], batch_size=32, epochs=4, store=store, run_id="digits")
    trained = estimator.fit(df)
    assert isinstance(trained, TorchModel)
    history = trained.getHistory()
    assert [h["epoch"] for h in history] == [1, 2, 3, 4]
    assert history[-1]["loss"] < history[0]["loss"] / 3
    assert os.path.exists(store.get_checkpoint_path("digits"))
    assert store.parquet_files(store.get_train_data_path("digits"))
    progress = capfd.readouterr()
    assert "epoch 4/4: loss" in progress.out and "rows/s" in progress.out
    predicted = trained.transform(df).toPandas()
    assert list(predicted.columns) == ["features", "label", "label__output"]
    guesses = np.stack(predicted["label__output"].to_numpy()).argmax(axis=1)
    assert (guesses == predicted["label"].to_numpy()).mean() > 0.9
    # the original model is untouched; the trained one is a copy
    assert not torch.equal(model[0].weight, trained.getModel()[0].weight)


def test_a_float_label_meets_a_one_value_output_in_its_shape(spark, tmp_path):
    # A regression on an ML vector column: the label column (batch,) is
    # shaped like the Linear(4, 1) output (batch, 1), so the loss falls as
    # it should, and transform keeps the input columns as they were.
    torch = pytest.importorskip("torch")
    import numpy as np
    from pyspark.ml.linalg import Vectors, VectorUDT

    from hora.spark.common.store import LocalStore
    from hora.spark.torch import TorchEstimator
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4))
    y = x @ np.array([1.5, -2.0, 0.5, 1.0]) + 0.3
    df = spark.createDataFrame([(Vectors.dense(row), float(target)) for row, target in zip(x, y)],
                               ["features", "label"])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    estimator = TorchEstimator(num_proc=2, model=model,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                               loss=torch.nn.functional.mse_loss, feature_cols=["features"],
                               label_cols=["label"], batch_size=32, epochs=8,
                               store=LocalStore(str(tmp_path / "store")), run_id="regression")
    trained = estimator.fit(df)
    losses = [h["loss"] for h in trained.getHistory()]
    assert losses[-1] < losses[0] / 20, losses
    predicted = trained.transform(df)
    assert isinstance(predicted.schema["features"].dataType, VectorUDT)
    assert predicted.columns == ["features", "label", "label__output"]
    rows = predicted.toPandas()
    assert np.abs(rows["label__output"] - rows["label"]).mean() < 0.5


def test_estimator_names_a_missing_column(spark, tmp_path):
    torch = pytest.importorskip("torch")
    from hora.spark.common.store import LocalStore
    from hora.spark.torch import TorchEstimator
    model = torch.nn.Linear(2, 1)
    df = spark.createDataFrame([([1.0, 2.0], 1.0)], ["x", "y"])
    estimator = TorchEstimator(num_proc=2, model=model,
                               optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                               loss=torch.nn.functional.mse_loss, feature_cols=["features"],
                               label_cols=["y"], store=LocalStore(str(tmp_path)))
    with pytest.raises(ValueError, match=r"feature_cols \['features'\] are not columns"):
        estimator.fit(df)


def test_digits_example_trains_with_the_estimator():
    import pathlib
    import re
    import subprocess
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    root = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "examples" / "spark" /
                                               "train_digits_spark.py"), "--epochs", "3"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=600, cwd=root,
                          env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    assert done.returncode == 0, done.stdout[-5000:]
    accuracy = re.search(r"test accuracy: ([0-9.]+)", done.stdout)
    assert accuracy and float(accuracy.group(1)) > 0.85, done.stdout[-5000:]
    assert "epoch 3/3: loss" in done.stdout
