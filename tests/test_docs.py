"""The documentation cannot drift from the code:

- the site builds with ``mkdocs build --strict`` (broken links and missing
  API references fail);
- each getting-started page walks through an example script: its titled
  code blocks, put together, are that script line by line, and running them
  under horarun on 2 ranks trains to the accuracy the page promises;
- every public name of the Python API has a docstring, and every horarun
  flag has help text and appears in the CLI reference page.
"""

import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

from launch import run_horarun

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TIMEOUT_SECONDS = 600
BLOCK = re.compile(r'^```python title="([^"]+)"\n(.*?)^```$', re.MULTILINE | re.DOTALL)
TOP_LEVEL = ("def ", "class ", "@", "if __name__")


def page_scripts(page):
    """{file name: source} put together from the page's titled python blocks.
    Blocks are joined the way PEP 8 spaces code: two blank lines before a
    top-level definition, one otherwise."""
    scripts = {}
    for title, body in BLOCK.findall(page.read_text()):
        body = body.rstrip("\n")
        if title in scripts:
            separator = "\n\n\n" if body.startswith(TOP_LEVEL) else "\n\n"
            scripts[title] += separator + body
        else:
            scripts[title] = body
    return {title: source + "\n" for title, source in scripts.items()}


GETTING_STARTED = sorted((DOCS / "getting-started").glob("*.md"))


def test_getting_started_pages_exist_for_every_framework():
    assert {p.stem for p in GETTING_STARTED} >= {"pytorch", "keras", "tensorflow", "mxnet"}


@pytest.mark.parametrize("page", GETTING_STARTED, ids=lambda p: p.stem)
def test_getting_started_blocks_are_the_example_line_by_line(page):
    scripts = page_scripts(page)
    assert scripts, f"{page.name} has no titled python blocks"
    for title, source in scripts.items():
        example = ROOT / title
        assert example.exists(), f"{page.name} walks through {title}, which does not exist"
        want, got = example.read_text().splitlines(), source.splitlines()
        for number, (a, b) in enumerate(zip(want, got), start=1):
            assert a == b, f"{page.name} differs from {title} at line {number}:\n{a!r}\n{b!r}"
        assert len(want) == len(got), f"{page.name} and {title} differ in length"


def framework_python(page):
    """The Python that runs a page's blocks: the MXNet environment for MXNet."""
    if page.stem != "mxnet":
        for module in {"pytorch": "torch", "keras": "tensorflow",
                       "tensorflow": "tensorflow"}.get(page.stem, "hora"), "sklearn":
            pytest.importorskip(module)
        return sys.executable
    python = os.environ.get("HORA_MXNET_PYTHON") or str(ROOT / ".venv-mxnet" / "bin" / "python")
    if not os.path.exists(python):
        pytest.skip(f"no MXNet environment at {python}; scripts/run_tests.sh creates it")
    return python


@pytest.mark.parametrize("page", GETTING_STARTED, ids=lambda p: p.stem)
def test_getting_started_blocks_train_on_two_ranks(page, job_env, tmp_path):
    python = framework_python(page)
    for title, source in page_scripts(page).items():
        script = tmp_path / pathlib.Path(title).name
        script.write_text(source)
        promised = re.search(r"reaches about (\d+)% test accuracy", page.read_text())
        assert promised, f"{page.name} does not say what accuracy the example reaches"
        output = run_horarun(
            2, [str(script), "--epochs", "8", "--checkpoint",
                str(tmp_path / ("ckpt.keras" if "keras" in title else "ckpt"))],
            job_env, tmp_path, python=python)
        accuracy = float(re.findall(r"test accuracy:? ([0-9.]+)", output)[-1])
        print(f"{title} from {page.name}, 2 ranks, 8 epochs: test accuracy {accuracy}")
        # 8 epochs instead of the default 12: allow a few points below the promise
        assert accuracy >= int(promised.group(1)) / 100 - 0.04, output[-5000:]


def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    job = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, stdout=subprocess.PIPE,
                         env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
                         stderr=subprocess.STDOUT, timeout=TIMEOUT_SECONDS)
    output = job.stdout.decode(errors="replace")
    assert job.returncode == 0, output[-8000:]
    assert (tmp_path / "site" / "index.html").exists()


PUBLIC_MODULES = ["hora", "hora.torch", "hora.torch.elastic", "hora.tensorflow",
                  "hora.tensorflow.elastic", "hora.tensorflow.keras",
                  "hora.tensorflow.keras.callbacks", "hora.tensorflow.keras.elastic",
                  "hora.spark", "hora.spark.torch", "hora.spark.common.store", "hora.ray"]


@pytest.mark.parametrize("module_name", PUBLIC_MODULES)
def test_every_public_name_has_a_docstring(module_name):
    framework = module_name.split(".")[1] if "." in module_name else None
    if framework:
        pytest.importorskip({"spark": "pyspark"}.get(framework, framework))
    module = importlib.import_module(module_name)
    missing = []
    for name, value in vars(module).items():
        if name.startswith("_") or not (inspect.isfunction(value) or inspect.isclass(value)):
            continue
        if not (value.__module__ or "").startswith("hora"):
            continue
        if not inspect.getdoc(value):
            missing.append(name)
        if inspect.isclass(value):
            for method_name, method in vars(value).items():
                if (not method_name.startswith("_") and inspect.isfunction(method)
                        and not inspect.getdoc(method)):
                    missing.append(f"{name}.{method_name}")
    assert not missing, f"{module_name}: no docstring for {', '.join(missing)}"


def command_lines():
    """(command, parser) for every command-line tool hora installs."""
    from hora.bench.__main__ import build_parser as bench
    from hora.runner.cli import build_parser as horarun
    from hora.timeline.__main__ import build_parser as timeline
    tools = [("horarun", horarun()), ("python -m hora.bench", bench()),
             ("python -m hora.timeline", timeline())]
    from hora.bench.elastic import build_parser as elastic
    tools.append(("python -m hora.bench elastic", elastic()))
    from hora.bench.negotiation import build_parser as negotiation
    tools.append(("python -m hora.bench negotiation", negotiation()))
    from hora.bench.multihost import build_parser as multihost
    tools.append(("python -m hora.bench multihost", multihost()))
    from hora.bench.tf_synthetic import build_parser as tf_synthetic  # imports no TensorFlow
    tools.append(("python -m hora.bench tf-synthetic", tf_synthetic()))
    try:
        from hora.bench.torch_synthetic import build_parser as torch_synthetic
        tools.append(("python -m hora.bench torch-synthetic", torch_synthetic()))
        from hora.bench.sharding import build_parser as sharding
        tools.append(("python -m hora.bench sharding", sharding()))
        from hora.bench.host_cost import build_parser as host_cost
        tools.append(("python -m hora.bench host-cost", host_cost()))
        from hora.bench.compression import build_parser as compression
        tools.append(("python -m hora.bench compression", compression()))
    except ImportError:  # torch is not installed
        pass
    for command, parser in list(tools):
        for action in parser._actions:
            choices = getattr(action, "choices", None)
            for name, sub in (choices.items() if isinstance(choices, dict) else ()):
                if hasattr(sub, "_actions"):
                    tools.append((f"{command} {name}", sub))
    return tools


def test_every_command_line_flag_has_help_and_is_in_the_cli_reference():
    reference = (DOCS / "reference" / "cli.md").read_text()
    undocumented, helpless = [], []
    for command, parser in command_lines():
        for action in parser._actions:
            if action.option_strings and not action.help:
                helpless.append(f"{command} {action.option_strings[0]}")
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and f"`{flag}" not in reference:
                    undocumented.append(f"{command} {flag}")
    assert not helpless, f"flags without help text: {helpless}"
    assert not undocumented, f"flags missing from docs/reference/cli.md: {undocumented}"


def test_every_environment_variable_is_in_the_configuration_page():
    read = set()
    for source in list((ROOT / "csrc").rglob("*.cc")) + list((ROOT / "csrc").rglob("*.h")) + \
            list((ROOT / "python").rglob("*.py")):
        read |= set(re.findall(r'"(HORA_[A-Z0-9_]+)"', source.read_text()))
    page = (DOCS / "reference" / "configuration.md").read_text()
    assert read, "found no HORA_ variables in the sources"
    missing = sorted(name for name in read if f"`{name}`" not in page)
    assert not missing, f"not in docs/reference/configuration.md: {missing}"
