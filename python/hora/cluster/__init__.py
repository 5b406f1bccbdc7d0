"""Running a hora job inside the processes of a cluster engine (Spark tasks,
Ray actors) instead of on hosts reached over ssh.

Every task or actor runs a small :class:`~hora.cluster.task_service.TaskService`.
The driver runs ``horarun`` with the task hosts under pseudonyms and an ssh
agent (:mod:`hora.cluster.ssh_agent`) that hands mpirun's daemon command to
the task service of that host instead of to ssh, so the MPI daemons, and the
ranks they start, run inside the engine's own processes. The ranks fetch the
function to run from the driver (:mod:`hora.cluster.rank_main`) and send its
result back. All connections are authenticated with a key made per job.
"""
from hora.cluster.job import JobError

__all__ = ["JobError"]
