"""Every install path goes through scripts/install.sh: the README's two
commands, CI, and both container images, so CI exercises the steps the
images run."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "bash scripts/run_tests.sh" in readme and "bash scripts/run_demo.sh" in readme
    assert "exec bash scripts/run_tests.sh" in (ROOT / ".ci" / "run").read_text()
    for script in ("run_tests.sh", "run_demo.sh"):
        assert "bash scripts/install.sh" in (ROOT / "scripts" / script).read_text(), script


def _instructions(text):
    """A Dockerfile's instructions, continuation lines joined, comments out."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return [" ".join(part.strip() for part in instruction.split("\\\n"))
            for instruction in re.split(r"(?<!\\)\n", "\n".join(lines)) if instruction.strip()]


def test_every_dockerfile_installs_through_the_install_script():
    images = sorted(d for d in (ROOT / "docker").glob("Dockerfile.*")
                    if d.name != "Dockerfile.cuda-pypi")  # a base image, without hora
    assert [d.name for d in images] == ["Dockerfile.cpu", "Dockerfile.cuda"]
    for dockerfile in images:
        text = dockerfile.read_text()
        runs = [i for i in _instructions(text) if "scripts/install.sh" in i]
        assert len(runs) == 1 and runs[0].startswith("RUN "), dockerfile.name
        assert "COPY . ." in text, dockerfile.name
        # no second, hand-written pip install of hora next to the script
        assert not re.search(r"pip install[^\n]*\s\.(\s|$|\[)", text), dockerfile.name
    cuda = (ROOT / "docker" / "Dockerfile.cuda").read_text()
    assert "HORA_WITH_CUDA=1" in cuda


def test_the_install_script_prepares_cuda_builds():
    text = (ROOT / "scripts" / "install.sh").read_text()
    assert "nvidia-nccl-cu$major" in text and "HORA_WITH_CUDA" in text


def test_horovod_build_script_names_what_is_missing(tmp_path):
    import subprocess
    script = ROOT / "scripts" / "install_horovod.sh"
    missing = tmp_path / "no-venv"
    job = subprocess.run(["bash", str(script)],
                         env={"HORA_VENV": str(missing), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, timeout=60)
    assert job.returncode == 1
    assert f"no Python environment at {missing}" in job.stderr


def test_the_package_ships_its_type_information():
    """py.typed marks hora as typed (PEP 561). wheel.packages ships every
    file of python/hora, so the installed package has it too."""
    import importlib.resources
    assert (ROOT / "python" / "hora" / "py.typed").is_file()
    assert importlib.resources.files("hora").joinpath("py.typed").is_file()
