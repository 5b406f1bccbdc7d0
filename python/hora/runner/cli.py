"""The ``horarun`` command line: ``horarun -np N [--verbose] command [args...]``."""
import argparse
import shlex
import signal
import subprocess
import sys

from hora.runner.mpi_command import (
    MpiError, build_mpirun_args, built_mpi_bin_dir, find_mpirun, pypi_mpirun, query_flavour)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"the number of processes must be at least 1, got {value}")
    return value


def build_parser():
    parser = argparse.ArgumentParser(
        prog="horarun",
        description="Run a command as N data-parallel ranks on this machine, through mpirun.",
        epilog="example: horarun -np 4 python train.py --epochs 3",
        # Abbreviations could silently match an option meant for the command.
        allow_abbrev=False,
    )
    parser.add_argument(
        "-np", "--num-proc", dest="num_proc", metavar="N", type=_positive_int, required=True,
        help="number of ranks to start",
    )
    parser.add_argument("--verbose", action="store_true", help="print the mpirun command before running it")
    parser.add_argument(
        "command", nargs=argparse.REMAINDER,
        help="the program and its arguments, run once per rank",
    )
    return parser


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    command = list(args.command)
    # REMAINDER keeps a separating "--"; it is ours, not the command's.
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        parser.error("missing the command to run, for example: horarun -np 2 python train.py")
    args.command = command
    return args


def build_command(mpirun, flavour, num_proc, command, python=None):
    """The full mpirun command line, as a list (never a shell string)."""
    python = sys.executable if python is None else python
    return [
        mpirun,
        *build_mpirun_args(flavour, num_proc),
        python, "-m", "hora.runner.rank_exec", "--",
        *command,
    ]


def _forward_signals(child):
    # A kill aimed at horarun must reach mpirun, which then stops every rank.
    def forward(signum, _frame):
        child.send_signal(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, forward)


def main(argv=None):
    args = parse_args(argv)
    try:
        mpirun = find_mpirun(system_bin_dir=built_mpi_bin_dir(), wheel_mpirun=pypi_mpirun())
        flavour = query_flavour(mpirun)
    except MpiError as exc:
        print(exc, file=sys.stderr)
        return 1

    cmd = build_command(mpirun, flavour, args.num_proc, args.command)
    if args.verbose:
        print(shlex.join(cmd), file=sys.stderr, flush=True)

    try:
        child = subprocess.Popen(cmd)
    except OSError as exc:
        print(f"horarun: could not start {mpirun}: {exc}", file=sys.stderr)
        return 1
    _forward_signals(child)
    code = child.wait()

    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        print(f"horarun: mpirun was killed by signal {name}", file=sys.stderr)
        return 128 - code
    if code != 0:
        print(f"horarun: job failed with exit code {code}", file=sys.stderr)
    return code
