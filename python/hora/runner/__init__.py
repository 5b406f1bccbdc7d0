"""``horarun``: start a hora job as N ranks on this machine through mpirun.

Everything in this subpackage uses the standard library only: the launcher
must start quickly and must work before (or without) the compiled extension.
"""
