"""The ``horarun`` command line.

``horarun -np N [-H host:slots,... | --hostfile FILE] [options] command [args...]``
runs ``command`` as N ranks through the ``mpirun`` that matches hora's MPI;
``horarun --check-build`` reports what this install can do.
"""
import argparse
import os
import shlex
import shutil
import sys
import tempfile

from hora.runner import check_build, config_file, elastic, hosts, supervise
from hora.runner.mpi_command import (
    OPEN_MPI, LaunchSpec, MpiError, build_mpirun_args, built_mpi_bin_dir, describe_version,
    find_mpirun, forwarded_env_names, pypi_mpirun, query_flavour, query_version_text,
    in_place_mpi_args, ulfm_capable, usable_cores)

DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_ELASTIC_TIMEOUT_S = 600.0
_LOG_LEVELS = config_file.LOG_LEVELS

# Horovod's options that hora takes but that change nothing here, with why
# (horarun says so when one is given).
_NO_EFFECT = {
    "disable_cache": "horarun keeps no cache of start-up checks",
    "hierarchical_allgather": "hora has no hierarchical allgather",
    "torus_allreduce": "hora has no torus allreduce",
    "autotune_steps_per_sample": "hora's autotuner samples by time (HORA_AUTOTUNE_SAMPLE_SECONDS)",
    "autotune_bayes_opt_max_samples": "hora's autotuner is not a Bayesian optimizer",
    "autotune_gaussian_process_noise": "hora's autotuner is not a Bayesian optimizer",
    "mpi_threads_disable": "hora's engine thread needs MPI_THREAD_MULTIPLE",
    "num_nccl_streams": "hora uses one NCCL stream per device",
    "thread_affinity": "hora does not pin its engine thread",
    "gloo_timeout_seconds": "hora has no Gloo controller",
    "tcp": "over MPI the transport is mpirun's choice (--mpi-args picks it); "
                "--transport tcp is hora's own TCP transport",
}


def _number(kind, minimum, expected):
    """An argparse type: ``kind(text)``, at least ``minimum``; ``expected``
    names what was wanted in the error."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value
    return parse


_positive_int = _number(int, 1, "a whole number of processes")


def _non_negative(kind):
    return _number(kind, 0, "a number")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="horarun",
        description="Run a command as N data-parallel ranks, on this machine or on several "
                    "hosts, through mpirun. A rank that fails stops the whole job.",
        epilog="examples:\n"
               "  horarun -np 4 python train.py --epochs 3\n"
               "  horarun -np 8 -H node1:4,node2:4 python train.py\n"
               "  horarun --check-build",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        # Abbreviations could silently match an option meant for the command.
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--version", action="version", version=_version(),
                        help="print hora's version and exit")
    parser.add_argument("-np", "--num-proc", dest="num_proc", metavar="N", type=_positive_int,
                        help="number of ranks to start (required unless --check-build); in "
                             "elastic mode, the ranks needed before training starts")
    parser.add_argument("-cb", "--check-build", action="store_true",
                        help="print what this install of hora can do (frameworks, MPI, CUDA, "
                             "NCCL) and why anything is missing, then exit")
    parser.add_argument("--config-file", metavar="FILE",
                        help="Horovod's YAML configuration file (sections params, autotune, "
                             "timeline, stall_check, library_options, logging); options given "
                             "on the command line win")
    where = parser.add_argument_group(
        "where the ranks run (default: this machine, one slot per core)")
    where = where.add_mutually_exclusive_group()
    where.add_argument("-H", "--hosts", metavar="HOST:SLOTS,...",
                       help="hosts and how many ranks each takes, e.g. node1:4,node2:4 "
                            "(a host without :N has one slot)")
    where.add_argument("-hostfile", "--hostfile", metavar="FILE",
                       help="a file with one host per line as 'host slots=N' or 'host:N'; "
                            "'#' starts a comment")
    transport = parser.add_argument_group("transport")
    transport.add_argument("--transport", choices=("mpi", "tcp"), default="mpi",
                           help="mpi (default): launch with mpirun, the ranks talk over MPI; "
                                "tcp: horarun starts the ranks itself and they talk over hora's "
                                "own TCP transport, with no MPI runtime (with "
                                "--elastic-in-place, the others go on in place even when a "
                                "whole host is lost)")
    transport.add_argument("--mpi", action="store_true", dest="use_mpi",
                           help="launch through mpirun (Horovod's flag; the default)")
    transport.add_argument("--tcp", action="store_true",
                           help="Horovod's flag; no effect here (see --transport)")
    transport.add_argument("--remote-shell", metavar="CMD", default="ssh",
                           help="with --transport tcp: how horarun starts ranks on other hosts "
                                "(run as CMD HOST COMMAND...; default ssh)")
    mpi = parser.add_argument_group("mpirun")
    mpi.add_argument("--mpi-args", metavar="ARGS", default="",
                     help="extra arguments for mpirun, as one quoted string "
                          "(e.g. \"--mca btl_tcp_if_include eth0\")")
    mpi.add_argument("--binding-args", metavar="ARGS", default=None,
                     help="mpirun's process binding arguments, replacing horarun's default "
                          "(each rank bound to its share of the cores; no binding when ranks "
                          "outnumber slots or run on several hosts); \"\" leaves binding "
                          "to mpirun")
    mpi.add_argument("-x", dest="env", metavar="VAR[=VALUE]", action="append", default=[],
                     help="pass this environment variable to every rank (its value here, or "
                          "VALUE); HORA_*, HOROVOD_*, PATH, PYTHONPATH and LD_LIBRARY_PATH "
                          "always are")
    mpi.add_argument("--start-timeout", metavar="S", type=_non_negative(float),
                     help=f"stop the job if not every rank has started within S seconds "
                          f"(default: HORA_START_TIMEOUT or HOROVOD_START_TIMEOUT, else "
                          f"{DEFAULT_START_TIMEOUT_S:g}; 0 waits for ever)")
    out = parser.add_argument_group("output")
    out.add_argument("--output-filename", metavar="DIR",
                     help="write each rank's stdout and stderr to DIR/rank.N/stdout and "
                          "DIR/rank.N/stderr (on the host the rank runs on) instead of "
                          "printing them with a [rank] prefix")
    out.add_argument("-prefix-timestamp", "--prefix-output-with-timestamp", action="store_true",
                     help="put the date and time before each line of the ranks' output")
    out.add_argument("--verbose", action="store_true",
                     help="print the mpirun command before running it")
    tuning = parser.add_argument_group("engine settings (the same as the HORA_* variables)")
    tuning.add_argument("--fusion-threshold-mb", type=_non_negative(float), metavar="MB",
                        help="fuse small tensors into buffers of up to MB MiB "
                             "(HORA_FUSION_THRESHOLD_BYTES; default 128)")
    tuning.add_argument("--cycle-time-ms", type=_non_negative(float), metavar="MS",
                        help="least time between two negotiation cycles (HORA_CYCLE_TIME_MS; "
                             "default 0: a cycle starts as soon as there is work)")
    tuning.add_argument("--cache-capacity", type=_non_negative(int), metavar="N",
                        help="entries in the response cache (HORA_CACHE_CAPACITY; default 1024; "
                             "0 turns it off)")
    tuning.add_argument("--log-level", choices=_LOG_LEVELS, type=str.lower,
                        help="the engine's log level, in either case (HORA_LOG_LEVEL; default "
                             "warning)")
    tuning.add_argument("--hierarchical-allreduce", action="store_true", default=None,
                        help="GPU allreduce within each host over NCCL, then across hosts "
                             "(HORA_HIERARCHICAL_ALLREDUCE=1)")
    tuning.add_argument("--no-hierarchical-allreduce", action="store_false",
                        dest="hierarchical_allreduce", help=argparse.SUPPRESS)
    tuning.add_argument("--autotune", action="store_true", default=None,
                        help="let rank 0 tune the fusion threshold and cycle time while the job "
                             "runs (HORA_AUTOTUNE=1); settings given explicitly stay fixed")
    tuning.add_argument("--no-autotune", action="store_false", dest="autotune",
                        help=argparse.SUPPRESS)
    tuning.add_argument("--autotune-log-file", metavar="FILE",
                        help="record every autotuning sample in this CSV file (HORA_AUTOTUNE_LOG)")
    tuning.add_argument("--autotune-warmup-samples", type=_non_negative(int), metavar="N",
                        help="samples the autotuner discards at the start "
                             "(HORA_AUTOTUNE_WARMUP_SAMPLES)")
    ignored = parser.add_argument_group(
        "Horovod options that change nothing in hora (accepted, so that command lines keep "
        "working; horarun says why when one is given)")
    ignored.add_argument("--disable-cache", action="store_true", default=None,
                         help=_NO_EFFECT["disable_cache"])
    for flag in ("hierarchical-allgather", "torus-allreduce", "mpi-threads-disable"):
        dest = flag.replace("-", "_")
        ignored.add_argument(f"--{flag}", action="store_true", dest=dest, default=None,
                             help=_NO_EFFECT[dest])
        ignored.add_argument(f"--no-{flag}", action="store_false", dest=dest,
                             help=argparse.SUPPRESS)
    for flag, kind in (("autotune-steps-per-sample", int), ("autotune-bayes-opt-max-samples", int),
                       ("autotune-gaussian-process-noise", float), ("num-nccl-streams", int),
                       ("thread-affinity", int), ("gloo-timeout-seconds", int)):
        ignored.add_argument(f"--{flag}", type=_non_negative(kind), metavar="N",
                             help=_NO_EFFECT[flag.replace("-", "_")])
    tuning.add_argument("--log-without-timestamp", action="store_false", default=None,
                        dest="log_with_timestamp",
                        help="the engine's log lines without the time (HORA_LOG_HIDE_TIME=1)")
    for flag, shown in (("--log-with-timestamp", True), ("--log-hide-timestamp", False),
                        ("--no-log-hide-timestamp", True)):
        tuning.add_argument(flag, action="store_true" if shown else "store_false",
                            dest="log_with_timestamp", help=argparse.SUPPRESS)
    seeing = parser.add_argument_group("seeing inside the job")
    seeing.add_argument("--timeline-filename", metavar="FILE",
                        help="rank 0 writes a Chrome-trace timeline of every collective to FILE "
                             "(HORA_TIMELINE); read it with python -m hora.timeline summarize")
    seeing.add_argument("--timeline-mark-cycles", action="store_true", default=None,
                        help="mark every engine cycle in the timeline (HORA_TIMELINE_MARK_CYCLES)")
    seeing.add_argument("--no-timeline-mark-cycles", action="store_false",
                        dest="timeline_mark_cycles", help=argparse.SUPPRESS)
    seeing.add_argument("--no-stall-check", action="store_true", default=None,
                        help="do not report collectives that some ranks never submit "
                             "(HORA_STALL_CHECK_DISABLE=1)")
    seeing.add_argument("--stall-check", action="store_false", dest="no_stall_check",
                        help=argparse.SUPPRESS)
    seeing.add_argument("--stall-check-warning-time-seconds", type=_non_negative(float),
                        metavar="S",
                        help="report a collective that some ranks have submitted and others "
                             "not after S seconds (HORA_STALL_CHECK_TIME_SECONDS; default 60)")
    seeing.add_argument("--stall-check-shutdown-time-seconds", type=_non_negative(float),
                        metavar="S",
                        help="stop the job with that report on every rank after S seconds "
                             "(HORA_STALL_SHUTDOWN_TIME_SECONDS; default 0: never)")
    elastic = parser.add_argument_group(
        "elastic training (hvd.elastic.run): the job is launched again after a lost rank or a "
        "change of hosts, and resumes from its last commit; --min-np, "
        "--host-discovery-script or --elastic-in-place turns it on")
    elastic.add_argument("--min-np", "--min-num-proc", dest="min_np", type=_positive_int,
                         metavar="N", help="fewest ranks to train with (default: -np)")
    elastic.add_argument("--max-np", "--max-num-proc", dest="max_np", type=_positive_int,
                         metavar="N",
                         help="most ranks to train with (default: -np without discovery, "
                              "every slot discovery finds with it)")
    elastic.add_argument("--host-discovery-script", metavar="SCRIPT",
                         help="executable printing the usable hosts, one 'host:slots' (or "
                              "'host') per line; run every second; turns on elastic mode")
    elastic.add_argument("--slots-per-host", type=_positive_int, metavar="N",
                         help="slots of a host the discovery script lists without a count "
                              "(default 1)")
    elastic.add_argument("--reset-limit", type=_non_negative(int), metavar="N",
                         help="most times the world may be re-formed before the job stops "
                              "(default: no limit)")
    elastic.add_argument("--blacklist-cooldown-range", type=_non_negative(float), nargs=2,
                         metavar=("MIN_S", "MAX_S"),
                         help="a host whose ranks keep failing is left out for a random time "
                              "in this range (default: for good)")
    elastic.add_argument("--supervisor-address", metavar="ADDRESS",
                         help="address at which rank 0 reaches horarun for host-change notices "
                              "when the job spans other hosts (default: this host's name)")
    elastic.add_argument("--elastic-in-place", action="store_true",
                         help="after a lost rank the other ranks keep their processes and go "
                              "on from the state they hold, in a world re-formed in place "
                              "(Open MPI 5 with ULFM; other MPIs relaunch every rank); they "
                              "start replacements for the lost ranks, which join at a later "
                              "commit")
    elastic.add_argument("--no-replace", action="store_true",
                         help="with --elastic-in-place: go on with the ranks that are left, "
                              "starting no replacements")
    elastic.add_argument("--elastic-timeout", type=_non_negative(float), metavar="S",
                         help=f"how long to wait for --min-np slots before giving up "
                              f"(default: HORA_ELASTIC_TIMEOUT or HOROVOD_ELASTIC_TIMEOUT, else "
                              f"{DEFAULT_ELASTIC_TIMEOUT_S:g})")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="the program and its arguments, run once per rank")
    return parser


# Options that take a value (argparse would take "--mpi-args --foo" for two
# options of ours, so their value is attached), from the parser itself.
def _value_options(parser):
    """{option: how many values it takes}."""
    return {option: action.nargs if isinstance(action.nargs, int) else 1
            for action in parser._actions
            if action.option_strings and action.nargs != 0 for option in action.option_strings}


_ARGS_OPTIONS = {"--mpi-args", "--binding-args"}


def _attach_args_values(argv, parser):
    """Rewrites ``--mpi-args "--x y"`` as ``--mpi-args=--x y`` in horarun's own
    options (never in the command's)."""
    argv = list(argv)
    value_options = _value_options(parser)
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--" or not token.startswith("-"):
            break  # the command starts here
        if token in _ARGS_OPTIONS and i + 1 < len(argv):
            argv[i:i + 2] = [f"{token}={argv[i + 1]}"]
            i += 1
        elif token in value_options:
            i += 1 + value_options[token]
        else:
            i += 1
    return argv


def _version():
    try:
        from importlib.metadata import version
        return f"hora {version('hora')}"
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "hora (version unknown: not installed as a package)"


def _env_seconds(env, names, default, parser):
    """The first of ``names`` set in ``env``, as seconds; else ``default``."""
    for name in names:
        text = env.get(name)
        if text:
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            if value < 0:
                parser.error(f"{name}={text!r}: expected a number of seconds")
            return value
    return default


def parse_args(argv=None, env=None):
    env = os.environ if env is None else env
    parser = build_parser()
    args = parser.parse_args(_attach_args_values(sys.argv[1:] if argv is None else argv, parser))
    command = list(args.command)
    # REMAINDER keeps a separating "--"; it is ours, not the command's.
    if command[:1] == ["--"]:
        command = command[1:]
    args.command = command
    if args.check_build:
        return args
    if args.config_file is not None:
        try:
            config_file.apply(args, config_file.load(args.config_file))
        except config_file.ConfigError as exc:
            parser.error(str(exc))
    if args.num_proc is None:
        parser.error("the number of ranks is required: -np N")
    if not command:
        parser.error("missing the command to run, for example: horarun -np 2 python train.py")
    if args.start_timeout is None:
        args.start_timeout = _env_seconds(env, ("HORA_START_TIMEOUT", "HOROVOD_START_TIMEOUT"),
                                          DEFAULT_START_TIMEOUT_S, parser)
    if args.elastic_timeout is None:
        args.elastic_timeout = _env_seconds(
            env, ("HORA_ELASTIC_TIMEOUT", "HOROVOD_ELASTIC_TIMEOUT"), DEFAULT_ELASTIC_TIMEOUT_S,
            parser)
    if args.use_mpi and args.transport == "tcp":
        parser.error("--mpi and --transport tcp: choose one")
    args.notes = [f"horarun: --{name.replace('_', '-')} has no effect in hora: {why}"
                  for name, why in _NO_EFFECT.items()
                  if getattr(args, name) not in (None, False)]
    try:
        args.mpi_args = shlex.split(args.mpi_args)
        args.binding_args = None if args.binding_args is None else shlex.split(args.binding_args)
    except ValueError as exc:
        parser.error(f"cannot split the mpirun arguments: {exc}")
    try:
        args.host_list = (hosts.parse_host_string(args.hosts) if args.hosts else
                          hosts.parse_hostfile(args.hostfile) if args.hostfile else None)
    except hosts.HostError as exc:
        parser.error(str(exc))
    args.elastic = None
    # elastic as in Horovod: --min-np or a discovery script (and hora's
    # --elastic-in-place); the fewest ranks default to -np
    if (args.min_np is not None or args.host_discovery_script is not None
            or args.elastic_in_place):
        min_np = args.num_proc if args.min_np is None else args.min_np
        max_np = args.max_np
        if max_np is None and args.host_discovery_script is None:
            max_np = args.num_proc
        if max_np is not None and max_np < min_np:
            parser.error(f"--max-np {max_np} is below --min-np {min_np}")
        if args.num_proc < min_np:
            parser.error(f"-np {args.num_proc} is below --min-np {min_np}")
        cooldown = args.blacklist_cooldown_range
        if cooldown is not None and cooldown[0] > cooldown[1]:
            parser.error("--blacklist-cooldown-range: MIN_S is above MAX_S")
        args.elastic = elastic.ElasticOptions(
            min_np=min_np, max_np=max_np, discovery_script=args.host_discovery_script,
            slots_per_host=args.slots_per_host, reset_limit=args.reset_limit,
            cooldown_range=None if cooldown is None else tuple(cooldown),
            elastic_timeout=args.elastic_timeout, supervisor_address=args.supervisor_address,
            in_place=args.elastic_in_place, replace=not args.no_replace)
    elif args.max_np is not None:
        args.notes.append("horarun: --max-np has no effect without --min-np or "
                          "--host-discovery-script (as in Horovod): the job is not elastic")
    for item in args.env:
        name = item.partition("=")[0]
        if not name or not (name[0].isalpha() or name[0] == "_") or \
                not all(c.isalnum() or c == "_" for c in name):
            parser.error(f"-x {item!r}: not a valid environment variable name")
    return args


def _flag(value):
    return None if value is None else ("1" if value else "0")


def job_environment(args, env):
    """The environment mpirun starts with, and the names every rank gets.
    Raises ValueError for a ``-x VAR`` that is not set."""
    env = dict(env)
    settings = {
        "HORA_FUSION_THRESHOLD_BYTES": None if args.fusion_threshold_mb is None
        else str(int(args.fusion_threshold_mb * 1024 * 1024)),
        "HORA_CYCLE_TIME_MS": None if args.cycle_time_ms is None else f"{args.cycle_time_ms:g}",
        "HORA_CACHE_CAPACITY": None if args.cache_capacity is None else str(args.cache_capacity),
        "HORA_LOG_LEVEL": args.log_level,
        "HORA_HIERARCHICAL_ALLREDUCE": _flag(args.hierarchical_allreduce),
        "HORA_AUTOTUNE": _flag(args.autotune),
        "HORA_AUTOTUNE_WARMUP_SAMPLES": None if args.autotune_warmup_samples is None
        else str(args.autotune_warmup_samples),
        "HORA_AUTOTUNE_LOG": os.path.abspath(args.autotune_log_file) if args.autotune_log_file
        else None,
        "HORA_TIMELINE": (os.path.abspath(args.timeline_filename) if args.timeline_filename
                          else None),
        "HORA_TIMELINE_MARK_CYCLES": _flag(args.timeline_mark_cycles),
        "HORA_STALL_CHECK_DISABLE": _flag(args.no_stall_check),
        "HORA_STALL_CHECK_TIME_SECONDS": None if args.stall_check_warning_time_seconds is None
        else f"{args.stall_check_warning_time_seconds:g}",
        "HORA_STALL_SHUTDOWN_TIME_SECONDS": None if args.stall_check_shutdown_time_seconds is None
        else f"{args.stall_check_shutdown_time_seconds:g}",
        "HORA_LOG_HIDE_TIME": None if args.log_with_timestamp is None
        else ("0" if args.log_with_timestamp else "1"),
        "HORA_PREFIX_OUTPUT_TIMESTAMP": "1" if args.prefix_output_with_timestamp else None,
    }
    env.update({name: value for name, value in settings.items() if value is not None})
    extra = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if sep:
            env[name] = value
        elif name not in env:
            raise ValueError(f"-x {name}: {name} is not set in this environment "
                             f"(use -x {name}=VALUE to give it a value)")
        extra.append(name)
    names = sorted(set(forwarded_env_names(env)) | set(extra))
    return env, names


def rank_path(env, command, prefix=sys.prefix, base_prefix=sys.base_prefix,
              which=shutil.which):
    """Sets the PATH every rank runs ``command`` with, and returns a note
    for the user or None.

    The ranks get this shell's PATH back (HORA_RANK_PATH, which the rank
    wrapper restores): Open MPI's mpirun, run by its full path, puts its own
    bin directory first on the ranks' PATH, and ``python`` would then be
    that directory's (a system MPI's /usr/bin/python3, without the user's
    packages). When horarun runs from a virtual environment whose bin
    directory is not on PATH, that directory leads the ranks' PATH, as if
    the environment were activated, so that ``.venv/bin/horarun python``
    runs the environment's python."""
    path = env.get("PATH", os.defpath)
    ranks_path = path
    if prefix != base_prefix:
        venv_bin = os.path.join(prefix, "bin")
        on_path = {os.path.realpath(p) for p in path.split(os.pathsep) if p}
        if os.path.realpath(venv_bin) not in on_path:
            ranks_path = venv_bin + os.pathsep + path
            env["VIRTUAL_ENV"] = prefix
    env["PATH"] = env["HORA_RANK_PATH"] = ranks_path
    program = command[0] if command else ""
    if ranks_path == path or os.sep in program:
        return None
    before, after = which(program, path=path), which(program, path=ranks_path)
    if after is None or before == after:
        return None
    return (f"horarun: '{program}' runs as {after} on the ranks: horarun's virtual environment "
            f"({prefix}) leads their PATH" + (f", not {before}" if before else ""))


def default_threads(env, spec):
    """Unless the user chose, each rank's OpenMP/BLAS pools get the rank's
    share of the cores (as torchrun does): otherwise every rank starts one
    thread per core of the host, and ranks sharing a host fight over them.
    On several hosts each rank's wrapper works its share out on its own
    host (hora.runner.rank_exec), whose cores this machine does not know."""
    if "OMP_NUM_THREADS" in env or spec.multi_host:
        return
    env["OMP_NUM_THREADS"] = str(spec.cores_per_rank)
    if "OMP_NUM_THREADS" not in spec.env_names:
        spec.env_names = sorted(spec.env_names + ["OMP_NUM_THREADS"])


def build_command(mpirun, flavour, spec, command, python=None, output_dir=None):
    """The full mpirun command line, as a list (never a shell string)."""
    python = sys.executable if python is None else python
    wrapper = [python, "-m", "hora.runner.rank_exec"]
    if output_dir is not None:
        wrapper += ["--output-dir", output_dir]
    return [mpirun, *build_mpirun_args(flavour, spec), *wrapper, "--", *command]


def _log(text):
    print(text, file=sys.stderr, flush=True)


def main(argv=None):
    args = parse_args(argv)
    if args.check_build:
        return check_build.main()
    for note in args.notes:
        _log(note)
    tcp = args.transport == "tcp"
    try:
        if tcp:
            mpirun = flavour = None  # horarun launches the ranks itself
        else:
            mpirun = find_mpirun(system_bin_dir=built_mpi_bin_dir(), wheel_mpirun=pypi_mpirun())
            flavour = query_flavour(mpirun)
        env, names = job_environment(args, os.environ)
        note = rank_path(env, args.command)
        names = sorted(set(names) | {"HORA_RANK_PATH", "PATH"} | set(
            ["VIRTUAL_ENV"] if "VIRTUAL_ENV" in env else []))
    except (MpiError, ValueError) as exc:
        _log(str(exc) if str(exc).startswith("horarun") else f"horarun: {exc}")
        return 1
    if note:
        _log(note)
    if (args.elastic is not None and args.elastic.in_place and not tcp
            and not ulfm_capable(mpirun, flavour)):
        _log(f"horarun: --elastic-in-place needs Open MPI 5 (ULFM); {mpirun} is "
             f"{describe_version(query_version_text(mpirun))}, so a lost rank relaunches every "
             f"rank from the last commit instead")
        args.elastic.in_place = False

    output_dir = os.path.abspath(args.output_filename) if args.output_filename else None
    with tempfile.TemporaryDirectory(prefix="horarun-") as scratch:

        def launch(num_proc, host_list, extra_env):
            if tcp:
                return launch_tcp(num_proc, host_list, extra_env)
            machinefile = None
            if host_list is not None and flavour != OPEN_MPI:
                machinefile = os.path.join(scratch, "machinefile")
                with open(machinefile, "w", encoding="utf-8") as f:
                    f.write(hosts.machinefile_text(host_list))
            job_env = dict(env, **extra_env)
            in_place = extra_env.get("HORA_ELASTIC_IN_PLACE") == "1"
            mpi_args = args.mpi_args
            if in_place:
                mpi_args = [*in_place_mpi_args(num_proc, host_list is None,
                                               args.elastic.max_np, usable_cores()), *mpi_args]
            spec = LaunchSpec(num_proc=num_proc, hosts=host_list, cores=usable_cores(),
                              env_names=sorted(set(names) | set(extra_env)),
                              binding_args=args.binding_args, mpi_args=mpi_args,
                              euid=os.geteuid(), machinefile=machinefile)
            default_threads(job_env, spec)
            cmd = build_command(mpirun, flavour, spec, args.command, output_dir=output_dir)
            if args.verbose:
                _log(shlex.join(cmd))
            for attempt in (1, 2):
                try:
                    outcome = supervise.run(cmd, num_proc, args.start_timeout,
                                            sys.stdout.buffer, sys.stderr.buffer, _log,
                                            env=job_env, in_place=in_place)
                except OSError as exc:
                    return supervise.Outcome(1, f"horarun: could not start {mpirun}: {exc}")
                if not (outcome.transient_start_failure and attempt == 1):
                    break
                _log("horarun: mpirun could not start its PMIx server, before any rank "
                     "started; launching the job once more")
            return outcome

        def launch_tcp(num_proc, host_list, extra_env):
            job_env = dict(env, **extra_env)
            spec = LaunchSpec(num_proc=num_proc, hosts=host_list, cores=usable_cores(),
                              env_names=sorted(set(names) | set(extra_env)),
                              binding_args=None, mpi_args=[], euid=os.geteuid())
            default_threads(job_env, spec)
            wrapper = [sys.executable, "-m", "hora.runner.rank_exec"]
            if output_dir is not None:
                wrapper += ["--output-dir", output_dir]
            cmd = [sys.executable, "-m", "hora.runner.tcp_launch", "--np", str(num_proc),
                   "--remote-shell", args.remote_shell,
                   "--env-names", ",".join(spec.env_names)]
            if host_list is not None:
                cmd += ["--hosts", ",".join(f"{h.name}:{h.slots}" for h in host_list)]
            if args.supervisor_address:
                cmd += ["--address", args.supervisor_address]
            cmd += ["--", *wrapper, "--", *args.command]
            if args.verbose:
                _log(shlex.join(cmd))
            try:
                return supervise.run(cmd, num_proc, args.start_timeout, sys.stdout.buffer,
                                     sys.stderr.buffer, _log, env=job_env,
                                     in_place=extra_env.get("HORA_ELASTIC_IN_PLACE") == "1")
            except OSError as exc:
                return supervise.Outcome(1, f"horarun: could not start the ranks: {exc}")

        if args.elastic is not None:
            fixed = args.host_list or [hosts.Host("localhost", args.num_proc)]
            discovery = elastic.Discovery(args.host_discovery_script, args.slots_per_host, fixed)
            code = elastic.run(args.elastic, discovery, launch, env, args.command, _log,
                               first_np=args.num_proc)
        else:
            outcome = launch(args.num_proc, args.host_list, {})
            if outcome.message:
                _log(outcome.message)
            code = outcome.code
    if output_dir is not None:
        _log(f"horarun: each rank's output is in {output_dir}/rank.<N>/stdout and stderr")
    return code

