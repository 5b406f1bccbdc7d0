"""``python -m hora.bench``: collective and engine benchmarks, run under horarun.

Each benchmark runs hora and the alternatives (raw MPI through mpi4py,
torch.distributed with gloo, Horovod) side by side in the same job, so the
numbers compare like with like. ``torch-synthetic`` instead measures
training images/sec with hora.torch.DistributedOptimizer next to the same
step without communication.
"""
