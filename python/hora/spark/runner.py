"""``hora.spark.run``: a hora job whose ranks live in the tasks of a Spark job."""
import os
import sys
import threading
import time
import uuid

from hora.cluster import channel
from hora.cluster.driver_service import DriverService, group_hosts
from hora.cluster.job import JobError, MpiJob, rank_failure, root_cause_order

START_TIMEOUT_ENV = "HORA_SPARK_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 600.0
# After the ranks are done, the Spark tasks get this long to return before
# their job is cancelled.
TASK_EXIT_S = 30.0
# When the MPI job fails with no rank to blame, how long to wait for Spark to
# report a failed task (the likelier cause).
SPARK_FAILURE_WAIT_S = 5.0


def _task_function(driver_address, key):
    def task(index, _rows):
        from hora.cluster.task_service import serve
        serve(index, driver_address, key)
        return iter([index])
    return task


class _SparkJob:
    """The Spark job whose tasks host the ranks, run from a thread of its own."""

    def __init__(self, sc, num_proc, driver):
        self.sc = sc
        self.group = f"hora.spark.run-{uuid.uuid4().hex[:12]}"
        self.error = None
        self.done = threading.Event()
        task = _task_function(driver.address, driver.key)

        def body():
            try:
                sc.setJobGroup(self.group, f"hora.spark.run: {num_proc} ranks",
                               interruptOnCancel=True)
                sc.parallelize(range(num_proc), num_proc).mapPartitionsWithIndex(task).collect()
            except Exception as exc:  # noqa: BLE001 - reported by run()
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=body, name="hora-spark-job", daemon=True)
        self.thread.start()

    def failure(self):
        if self.error is None:
            return None
        # Py4J errors carry the whole Java stack; the task's own error is in
        # the lines that are not stack frames
        lines = [line for line in str(self.error).strip().splitlines()
                 if not line.lstrip().startswith("at ") and line.strip()]
        return "\n".join(lines[:12])

    def cancel(self):
        try:
            self.sc.cancelJobGroup(self.group)
        except Exception:  # noqa: BLE001 - the context may be stopping
            pass
        self.done.wait(TASK_EXIT_S)


def _active_context():
    try:
        from pyspark import SparkContext
    except ImportError:
        raise ImportError("hora.spark needs PySpark: pip install 'hora[spark]'") from None
    sc = SparkContext._active_spark_context
    if sc is None:
        raise ValueError("hora.spark.run: no active SparkContext; create a SparkSession "
                         "(or SparkContext) before calling run")
    return sc


def run(fn, args=(), kwargs=None, num_proc=None, start_timeout=None, use_mpi=None,
        use_gloo=None, extra_mpi_args=None, env=None, stdout=None, stderr=None, verbose=1,
        nics=None, prefix_output_with_timestamp=False, executable=None):
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` ranks inside Spark tasks of
    the active SparkContext and return its results, in rank order.

    ``num_proc`` defaults to the context's default parallelism.
    The parameters are Horovod's, in its order. ``start_timeout`` (default
    HORA_SPARK_START_TIMEOUT, HOROVOD_SPARK_START_TIMEOUT or 600 s) bounds how
    long the tasks may take to start. The ranks talk over MPI: ``use_mpi``
    may be True or None, and ``use_gloo=True`` raises ``ValueError`` (hora
    has no Gloo controller). ``env`` adds variables to the ranks'
    environment; ``stdout``/``stderr`` receive the ranks' output (default:
    this process's), with the date and time before each line when
    ``prefix_output_with_timestamp``. ``nics`` restricts MPI to those
    interfaces; ``extra_mpi_args`` go to mpirun; ``executable`` is the Python
    the ranks run (default: this one's). Raises :class:`hora.spark.JobError`
    naming the rank and host when a rank raises, a task fails or the tasks do
    not all start; nothing of the job is left running.
    """
    if use_gloo:
        raise ValueError("hora.spark.run: use_gloo=True: hora has no Gloo controller; its ranks "
                         "talk over MPI (leave use_gloo unset)")
    if use_mpi is not None and not use_mpi:
        raise ValueError("hora.spark.run: use_mpi=False: hora's ranks talk over MPI (leave "
                         "use_mpi unset)")
    sc = _active_context()
    kwargs = {} if kwargs is None else kwargs
    num_proc = sc.defaultParallelism if num_proc is None else int(num_proc)
    if num_proc < 1:
        raise ValueError(f"hora.spark.run: num_proc must be at least 1, got {num_proc}")
    if start_timeout is None:
        start_timeout = float(os.environ.get(START_TIMEOUT_ENV) or
                              os.environ.get("HOROVOD_SPARK_START_TIMEOUT") or
                              DEFAULT_START_TIMEOUT_S)

    def log(text):
        if verbose >= 1:
            print(text, file=sys.stderr, flush=True)

    key = channel.new_key()
    driver = DriverService(key, channel.local_address(sc.getConf().get("spark.driver.host")))
    driver.set_job(channel.dumps((fn, tuple(args), dict(kwargs))))
    spark_job = _SparkJob(sc, num_proc, driver)
    job = None
    succeeded = False
    started = time.monotonic()
    try:
        reason = driver.wait_for_tasks(num_proc, start_timeout, abandoned=spark_job.failure)
        if reason == "timeout":
            missing = sorted(set(range(num_proc)) - set(driver.tasks()))
            raise JobError(
                f"hora.spark.run: only {num_proc - len(missing)} of {num_proc} Spark tasks "
                f"started within {start_timeout:g} s (tasks {missing} did not); the cluster "
                f"may have fewer free task slots than num_proc={num_proc} (default "
                f"parallelism: {sc.defaultParallelism})")
        if reason:
            raise JobError(f"hora.spark.run: a Spark task failed before the ranks started:\n"
                           f"{reason}")
        groups = group_hosts(driver.tasks().values())
        driver.set_hosts(groups)
        log(f"hora.spark.run: {num_proc} tasks started in {time.monotonic() - started:.1f} s "
            f"on {', '.join(f'{g.hostname} ({len(g.tasks)})' for g in groups)}; "
            f"running {num_proc} ranks")
        job = MpiJob(driver, groups, "run", env=env, extra_mpi_args=extra_mpi_args, nics=nics,
                     stdout=stdout, stderr=stderr, verbose=verbose,
                     start_timeout=max(start_timeout, 60.0), log=log,
                     prefix_output_with_timestamp=prefix_output_with_timestamp,
                     executable=executable)
        code = None
        while code is None:
            code = job.wait(0.2)
            if code is None and spark_job.failure():
                job.stop()
                code = job.wait()
        results = driver.results()
        failed = sorted((r for r in results.values() if not r.ok),
                        key=lambda r: root_cause_order(r.error_type, r.failed_at, r.rank))
        if failed:
            raise rank_failure("hora.spark.run", failed[0])
        if code != 0:
            # a lost task ends the MPI job first; Spark says why a moment later
            spark_job.done.wait(SPARK_FAILURE_WAIT_S)
        if spark_job.failure():
            raise JobError(f"hora.spark.run: a Spark task failed while the ranks ran:\n"
                           f"{spark_job.failure()}")
        missing = sorted(set(range(num_proc)) - set(results))
        if code != 0 or missing:
            raise JobError(f"hora.spark.run: the MPI job ended with exit code {code} before "
                           f"ranks {missing} returned a result; its last output:\n{job.tail()}")
        values = [channel.loads(results[rank].payload) for rank in range(num_proc)]
        succeeded = True
        log(f"hora.spark.run: {num_proc} ranks done in {time.monotonic() - started:.1f} s")
        return values
    finally:
        if job is not None:
            job.stop()
        driver.release_tasks()
        # after a success the tasks return by themselves; after a failure
        # (tasks still waiting for slots, say) the Spark job is cancelled
        if not (succeeded and spark_job.done.wait(TASK_EXIT_S)):
            spark_job.cancel()
        driver.close()
