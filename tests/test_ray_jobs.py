"""hora.ray.RayExecutor against a real local Ray (ray.init(num_cpus=2)):
2- and 3-rank jobs with results in rank order, the executable object, and
the failures (a rank that raises, an actor that dies), each ending with no
process left."""
import concurrent.futures
import sys
import time

import pytest

from cluster_procs import assert_no_job_processes

ray = pytest.importorskip("ray", reason="ray is not installed (pip install hora[ray])")
import cloudpickle  # noqa: E402

from hora.ray import JobError, RayExecutor  # noqa: E402

# The ranks cannot import this test module: its functions travel by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _executor(num_workers):
    # 3 ranks on 2 CPUs: each actor asks for half a CPU
    return RayExecutor(RayExecutor.create_settings(timeout_s=120), num_workers=num_workers,
                       cpus_per_worker=0.5)


class Counter:
    def __init__(self, start):
        self.value = start

    def bump(self):
        self.value += 1
        return self.value


def _train(steps, lr=0.1):
    import torch

    import hora.torch as hvd
    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    for step in range(steps):
        optimizer.zero_grad()
        model(torch.full((4, 3), float(hvd.rank() + step))).pow(2).mean().backward()
        optimizer.step()
    total = hvd.allreduce(torch.tensor([float(hvd.rank())]), op=hvd.Sum).item()
    gathered = hvd.allgather(torch.tensor([hvd.rank()])).tolist()
    return hvd.rank(), hvd.size(), total, gathered, model.weight.detach().flatten().tolist()


@pytest.mark.parametrize("num_workers", [2, 3])
def test_run_execute_and_run_remote_return_values_in_rank_order(cluster, num_workers):
    executor = _executor(num_workers)
    executor.start(executable_cls=Counter, executable_args=[10])
    try:
        for steps in (2, 3):  # a second call reuses the same job
            results = executor.run(_train, args=[steps], kwargs={"lr": 0.05})
            assert [r[0] for r in results] == list(range(num_workers))
            for _rank, size, total, gathered, weights in results:
                assert size == num_workers
                assert total == sum(range(num_workers))
                assert gathered == list(range(num_workers))
                assert weights == results[0][4]  # identical replicas
        assert executor.execute(lambda counter: counter.bump()) == [11] * num_workers
        assert executor.execute_single(lambda counter: counter.bump()) == 12
        assert executor.execute(lambda counter: counter.value) == [12] + [11] * (num_workers - 1)
        refs = executor.run_remote(_train, args=[1])
        assert [r[0] for r in ray.get(refs)] == list(range(num_workers))
    finally:
        executor.shutdown()
    assert_no_job_processes()


def _raise_on_rank_one():
    import torch

    import hora.torch as hvd
    hvd.init()
    if hvd.rank() == 1:
        raise KeyError("no such column")
    hvd.allreduce(torch.ones(1), name="never.completes")


def test_a_rank_that_raises_ends_run_with_its_rank_and_traceback(cluster):
    executor = _executor(3)
    executor.start()
    try:
        started = time.monotonic()
        with pytest.raises(JobError) as info:
            executor.run(_raise_on_rank_one)
        assert time.monotonic() - started < 60
        error = info.value
        assert error.rank == 1 and error.host and error.error_type == "KeyError"
        assert "rank 1" in str(error) and "KeyError: 'no such column'" in str(error)
        assert "_raise_on_rank_one" in error.remote_traceback
        # the job is over: a further call says so instead of hanging
        with pytest.raises(JobError, match=r"shutdown\(\) and start\(\) again"):
            executor.run(lambda: 1)
    finally:
        executor.shutdown()
    assert_no_job_processes()
    # a fresh start works
    executor.start()
    try:
        assert executor.run(lambda: 5) == [5, 5, 5]
    finally:
        executor.shutdown()
    assert_no_job_processes()


def test_an_actor_that_dies_ends_run_naming_its_rank(cluster):
    executor = _executor(2)
    executor.start()
    try:
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            call = pool.submit(executor.run, time.sleep, [120])
            time.sleep(2)
            ray.kill(executor.workers[1])
            started = time.monotonic()
            with pytest.raises(JobError) as info:
                call.result(timeout=60)
            assert time.monotonic() - started < 30
        assert info.value.rank == 1
        assert "the actor of rank 1 died" in str(info.value)
    finally:
        executor.shutdown()
    assert_no_job_processes()


def test_shutdown_leaves_no_actor_and_settings_are_checked(cluster):
    with pytest.raises(ValueError, match="gpus_per_worker is set, but use_gpu is False"):
        RayExecutor(RayExecutor.create_settings(timeout_s=10), num_workers=1,
                    gpus_per_worker=1)
    with pytest.raises(ValueError, match="num_workers"):
        RayExecutor(RayExecutor.create_settings(timeout_s=10))
    executor = _executor(2)
    with pytest.raises(RuntimeError, match="not started"):
        executor.run(lambda: 1)
    executor.start()
    actors = list(executor.workers)
    executor.shutdown()
    for actor in actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.hostname.remote(), timeout=30)
    assert_no_job_processes()


def test_digits_example_trains_on_ray_actors():
    import os
    import pathlib
    import re
    import subprocess
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    root = pathlib.Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, str(root / "examples" / "ray" / "train_digits_ray.py"),
                           "--epochs", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=600, cwd=root, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-5000:]
    accuracy = re.search(r"test accuracy: ([0-9.]+) on 300 held-out images, 2 ranks agree",
                         done.stdout)
    assert accuracy and float(accuracy.group(1)) > 0.8, done.stdout[-5000:]
    assert_no_job_processes()
