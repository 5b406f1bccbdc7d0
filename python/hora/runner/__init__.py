"""``horarun``: start a hora job as N ranks on this machine through mpirun;
and ``run``, Horovod's ``horovod.run`` from Python (also ``hora.run``).

Everything in this subpackage uses the standard library only (``run``
imports the rest when called): the launcher must start quickly and must
work before (or without) the compiled extension.
"""

from hora.runner.run_func import run

__all__ = ["run"]
