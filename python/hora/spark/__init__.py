"""hora jobs inside Spark: ``hora.spark.run(fn, num_proc=N)`` runs ``fn`` on N
ranks that live in Spark tasks and returns its results in rank order, as
``horovod.spark.run`` does. See docs/spark-and-ray.md."""
from hora.cluster.job import JobError
from hora.spark.runner import run

__all__ = ["JobError", "run"]
