"""hora jobs on Ray: ``hora.ray.RayExecutor``, Horovod's Ray API, with the
ranks started by MPI inside Ray actors. See docs/spark-and-ray.md."""
from hora.cluster.job import JobError
from hora.ray.runner import RayExecutor, RaySettings

__all__ = ["JobError", "RayExecutor", "RaySettings"]
