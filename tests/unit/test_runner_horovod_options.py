"""horarun takes horovodrun's command lines: its aliases, upper-case log
levels, its environment variables for the timeouts, its YAML config file,
and its options that change nothing in hora (accepted, with a note saying
why). Elastic mode starts as in Horovod, needing -np ranks by default."""

import io
import subprocess
import sys
import textwrap

import pytest

from hora.runner import cli, rank_exec


def _parse_error(argv, capsys, env=None):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv, env=env or {})
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_horovods_aliases(tmp_path):
    hostfile = tmp_path / "hosts.txt"
    hostfile.write_text("node1 slots=2\nnode2 slots=2\n")
    args = cli.parse_args(["-np", "4", "-hostfile", str(hostfile), "--min-num-proc", "2",
                           "--max-num-proc", "6", "python", "t.py"], env={})
    assert [(h.name, h.slots) for h in args.host_list] == [("node1", 2), ("node2", 2)]
    assert (args.elastic.min_np, args.elastic.max_np) == (2, 6)
    assert cli.parse_args(["-cb"], env={}).check_build


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--version"], env={})
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("hora ")


@pytest.mark.parametrize("level", ["DEBUG", "debug", "Warning", "FATAL"])
def test_log_levels_in_either_case(level):
    args = cli.parse_args(["-np", "2", "--log-level", level, "x"], env={})
    env, _ = cli.job_environment(args, {})
    assert env["HORA_LOG_LEVEL"] == level.lower()


def test_a_log_level_neither_knows_is_refused(capsys):
    assert "invalid choice" in _parse_error(["-np", "2", "--log-level", "LOUD", "x"], capsys)


def test_timeouts_from_horovods_environment_variables(capsys):
    args = cli.parse_args(["-np", "2", "--min-np", "1", "x"],
                          env={"HOROVOD_START_TIMEOUT": "12", "HOROVOD_ELASTIC_TIMEOUT": "34"})
    assert args.start_timeout == 12 and args.elastic.elastic_timeout == 34
    args = cli.parse_args(["-np", "2", "x"], env={"HORA_START_TIMEOUT": "5",
                                                  "HOROVOD_START_TIMEOUT": "12"})
    assert args.start_timeout == 5  # hora's name first
    # the command line wins; with neither, hora's defaults
    args = cli.parse_args(["-np", "2", "--start-timeout", "7", "x"],
                          env={"HOROVOD_START_TIMEOUT": "12"})
    assert args.start_timeout == 7
    args = cli.parse_args(["-np", "2", "x"], env={})
    assert args.start_timeout == cli.DEFAULT_START_TIMEOUT_S
    assert "HOROVOD_START_TIMEOUT='soon'" in _parse_error(
        ["-np", "2", "x"], capsys, env={"HOROVOD_START_TIMEOUT": "soon"})


def test_elastic_mode_starts_as_in_horovod():
    # --min-np alone: the fewest ranks are what it says, the most -np
    args = cli.parse_args(["-np", "4", "--min-np", "2", "x"], env={})
    assert (args.elastic.min_np, args.elastic.max_np) == (2, 4)
    # a discovery script alone: -np ranks are needed before training starts
    args = cli.parse_args(["-np", "4", "--host-discovery-script", "d.sh", "x"], env={})
    assert (args.elastic.min_np, args.elastic.max_np) == (4, None)
    # --max-np alone turns nothing on, and horarun says so
    args = cli.parse_args(["-np", "4", "--max-np", "8", "x"], env={})
    assert args.elastic is None
    assert any("--max-np has no effect" in note for note in args.notes)


def test_options_that_change_nothing_are_accepted_with_a_note():
    args = cli.parse_args(["-np", "2", "--disable-cache", "--hierarchical-allgather",
                           "--mpi-threads-disable", "--num-nccl-streams", "2",
                           "--thread-affinity", "1", "--gloo-timeout-seconds", "30",
                           "--autotune-steps-per-sample", "5", "--tcp", "--mpi", "x"], env={})
    notes = "\n".join(args.notes)
    for flag in ("--disable-cache", "--hierarchical-allgather", "--mpi-threads-disable",
                 "--num-nccl-streams", "--thread-affinity", "--gloo-timeout-seconds",
                 "--autotune-steps-per-sample", "--tcp"):
        assert f"horarun: {flag} has no effect in hora: " in notes, flag
    assert cli.parse_args(["-np", "2", "--no-hierarchical-allgather", "x"], env={}).notes == []


def test_mpi_and_tcp_transport_conflict(capsys):
    assert "choose one" in _parse_error(["-np", "2", "--mpi", "--transport", "tcp", "x"], capsys)


def test_options_that_map_to_hora_settings():
    args = cli.parse_args(["-np", "2", "--hierarchical-allreduce", "--no-autotune",
                           "--autotune-warmup-samples", "4", "--no-timeline-mark-cycles",
                           "--stall-check", "--log-without-timestamp",
                           "--prefix-output-with-timestamp", "x"], env={})
    env, _ = cli.job_environment(args, {})
    assert env["HORA_HIERARCHICAL_ALLREDUCE"] == "1"
    assert env["HORA_AUTOTUNE"] == "0" and env["HORA_AUTOTUNE_WARMUP_SAMPLES"] == "4"
    assert env["HORA_TIMELINE_MARK_CYCLES"] == "0" and env["HORA_STALL_CHECK_DISABLE"] == "0"
    assert env["HORA_LOG_HIDE_TIME"] == "1" and env["HORA_PREFIX_OUTPUT_TIMESTAMP"] == "1"
    env, _ = cli.job_environment(cli.parse_args(["-np", "2", "-prefix-timestamp", "x"],
                                                env={}), {})
    assert env["HORA_PREFIX_OUTPUT_TIMESTAMP"] == "1"
    # nothing given: nothing set, so the engine's defaults (or the user's
    # own HORA_*/HOROVOD_* variables) apply
    env, _ = cli.job_environment(cli.parse_args(["-np", "2", "x"], env={}), {})
    for name in ("HORA_HIERARCHICAL_ALLREDUCE", "HORA_AUTOTUNE", "HORA_LOG_HIDE_TIME",
                 "HORA_STALL_CHECK_DISABLE", "HORA_PREFIX_OUTPUT_TIMESTAMP"):
        assert name not in env


def test_a_value_list_option_before_mpi_args():
    args = cli.parse_args(["-np", "2", "--min-np", "1", "--blacklist-cooldown-range", "1", "5",
                           "--mpi-args", "--mca btl tcp,self", "python", "t.py"], env={})
    assert args.mpi_args == ["--mca", "btl", "tcp,self"] and args.command == ["python", "t.py"]


def test_config_file(tmp_path):
    config = tmp_path / "hvd.yaml"
    config.write_text(textwrap.dedent("""\
        controller: mpi
        params:
          fusion_threshold_mb: 32
          cycle_time_ms: 2.5
          hierarchical_allreduce: true
        autotune:
          enabled: true
          warmup_samples: 2
        timeline:
          filename: tl.json
          mark_cycles: true
        stall_check:
          enabled: false
          warning_time_seconds: 10
        logging:
          level: DEBUG
          with_timestamp: false
        """))
    args = cli.parse_args(["-np", "2", "--config-file", str(config), "--cycle-time-ms", "7",
                           "x"], env={})
    env, _ = cli.job_environment(args, {})
    assert env["HORA_FUSION_THRESHOLD_BYTES"] == str(32 * 1024 * 1024)
    assert env["HORA_CYCLE_TIME_MS"] == "7"  # the command line wins
    assert env["HORA_HIERARCHICAL_ALLREDUCE"] == "1" and env["HORA_AUTOTUNE"] == "1"
    assert env["HORA_AUTOTUNE_WARMUP_SAMPLES"] == "2"
    assert env["HORA_TIMELINE"].endswith("tl.json") and env["HORA_TIMELINE_MARK_CYCLES"] == "1"
    assert env["HORA_STALL_CHECK_DISABLE"] == "1"
    assert env["HORA_STALL_CHECK_TIME_SECONDS"] == "10"
    assert env["HORA_LOG_LEVEL"] == "debug" and env["HORA_LOG_HIDE_TIME"] == "1"


@pytest.mark.parametrize("text, message", [
    ("params:\n  fusion_treshold_mb: 8\n", "unknown key 'fusion_treshold_mb' in section 'params'"),
    ("tuning:\n  x: 1\n", "unknown section 'tuning'"),
    ("params:\n  cycle_time_ms: -1\n", "params.cycle_time_ms must be a number >= 0"),
    ("autotune:\n  enabled: maybe\n", "autotune.enabled must be true or false"),
    ("controller: gloo\n", "hora has no Gloo controller"),
    ("- a list\n", "expected a mapping of sections"),
    ("params: [\n", "not YAML"),
])
def test_config_file_errors_name_the_key(tmp_path, capsys, text, message):
    config = tmp_path / "hvd.yaml"
    config.write_text(text)
    assert message in _parse_error(["-np", "2", "--config-file", str(config), "x"], capsys)


def test_missing_config_file(tmp_path, capsys):
    assert "No such file" in _parse_error(
        ["-np", "2", "--config-file", str(tmp_path / "none.yaml"), "x"], capsys)


def test_relay_puts_the_time_before_each_line():
    source = io.BufferedReader(io.BytesIO(b"one\ntwo"))
    sink = io.BytesIO()
    rank_exec.relay(source, sink, b"[3] ", stamped=True)
    lines = sink.getvalue().decode().splitlines()
    assert [line.split("[3] ")[1] for line in lines] == ["one", "two"]
    # "Sun Nov 29 20:31:02 2026 [3] one"
    assert all(len(line.split("[3] ")[0].split()) == 5 for line in lines)


def test_horarun_prints_the_notes(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hora.runner", "-np", "1", "--disable-cache",
                           sys.executable, "-c", "pass"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "horarun: --disable-cache has no effect in hora" in done.stderr
