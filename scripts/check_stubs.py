"""Fails when python/hora/_C.pyi no longer describes the built hora._C.

Runs mypy's stubtest (``python -m mypy.stubtest hora._C``) on the stub in the
work tree (scripts/stubtest/mypy.ini puts python/ first on mypy's path; a
MYPYPATH given comes before it) against the hora._C this Python imports.
stubtest reads a function's parameters through inspect.signature, which
pybind11 functions do not support, so on its own it would check names only;
here it falls back to the signature pybind11 writes as the first line of each
docstring ("init(comm_handle: object = None, ...) -> None"), so that
parameter names, order, kinds and defaults are checked too (parameter and
return types are not: stubtest has no runtime types to compare them with).
pybind11 parameters without a name (arg0, arg1, ...) cannot be passed by
keyword, so they are positional-only.

What stubtest cannot be told otherwise is allowlisted in scripts/stubtest/
(one reason per entry): allowlist.txt always, allowlist-cpu-build.txt for a
build without CUDA, allowlist-before-py312.txt on Python < 3.12. An entry that
no longer matches anything fails the check too.

Run from anywhere; the style step (scripts/check_style.sh) runs it.
"""

import ast
import inspect
import re
import sys
from pathlib import Path

import mypy.stubtest as stubtest

ROOT = Path(__file__).resolve().parent.parent
ALLOWLISTS = ROOT / "scripts" / "stubtest"

# pybind11's name for a parameter bound without py::arg.
_UNNAMED = re.compile(r"arg\d+")
# Functions whose docstring signature could not be read: reported as failures,
# since stubtest would otherwise check them silently less.
unreadable: list[str] = []
# Signatures read from docstrings; none means stubtest no longer asks through
# safe_inspect_signature (a new mypy), and the check would have lost them.
read: list[str] = []


def _default(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return stubtest.UNREPRESENTABLE


def pybind11_signature(runtime):
    """The signature in a pybind11 docstring's first line, or None when the
    object has none (not a pybind11 function)."""
    name = getattr(runtime, "__name__", None)
    doc = getattr(runtime, "__doc__", None)
    if not isinstance(name, str) or not isinstance(doc, str):
        return None
    first = doc.partition("\n")[0]
    if first.startswith("Overloaded function"):
        unreadable.append(f"{name}: overloaded (one signature per overload)")
        return None
    if not first.startswith(name + "("):
        return None
    try:
        function = ast.parse(f"def {first}: ...").body[0]
    except SyntaxError as error:
        unreadable.append(f"{name}: {first!r}: {error.msg}")
        return None
    assert isinstance(function, ast.FunctionDef)
    args = function.args
    Parameter = inspect.Parameter
    # Defaults belong to the last positional parameters.
    positional = [(a, Parameter.POSITIONAL_ONLY) for a in args.posonlyargs]
    positional += [(a, Parameter.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults = [Parameter.empty] * (len(positional) - len(args.defaults))
    defaults += [_default(d) for d in args.defaults]
    # Everything up to the last unnamed parameter is positional-only (self
    # included), as pybind11 rejects unnamed ones given by keyword.
    last_unnamed = max((i for i, (a, _) in enumerate(positional) if _UNNAMED.fullmatch(a.arg)),
                       default=-1)
    parameters = [Parameter(a.arg, Parameter.POSITIONAL_ONLY if i <= last_unnamed else kind,
                            default=default)
                  for i, ((a, kind), default) in enumerate(zip(positional, defaults))]
    if args.vararg:
        parameters.append(Parameter(args.vararg.arg, Parameter.VAR_POSITIONAL))
    for a, default in zip(args.kwonlyargs, args.kw_defaults):
        parameters.append(Parameter(a.arg, Parameter.KEYWORD_ONLY,
                                    default=Parameter.empty if default is None
                                    else _default(default)))
    if args.kwarg:
        parameters.append(Parameter(args.kwarg.arg, Parameter.VAR_KEYWORD))
    read.append(name)
    return inspect.Signature(parameters)


_inspect_signature = stubtest.safe_inspect_signature


def safe_inspect_signature(runtime):
    found = _inspect_signature(runtime)
    return found if found is not None else pybind11_signature(runtime)


def main() -> int:
    import hora._C

    allowlists = ["allowlist.txt"]
    if not hora._C.build_info()["cuda_built"]:
        allowlists.append("allowlist-cpu-build.txt")
    if sys.version_info < (3, 12):
        allowlists.append("allowlist-before-py312.txt")
    args = ["hora._C", "--mypy-config-file", str(ALLOWLISTS / "mypy.ini")]
    for name in allowlists:
        args += ["--allowlist", str(ALLOWLISTS / name)]
    stubtest.safe_inspect_signature = safe_inspect_signature
    status = stubtest.test_stubs(stubtest.parse_options(args))
    failed = bool(status)
    for entry in unreadable:
        print(f"error: cannot read the pybind11 signature of {entry}; "
              "teach scripts/check_stubs.py to read it")
        failed = True
    if not status and not read:
        print("error: stubtest read no pybind11 signature through safe_inspect_signature; "
              "this mypy's stubtest needs scripts/check_stubs.py adapted")
        failed = True
    if not failed:
        print(f"stubs: python/hora/_C.pyi matches {hora._C.__file__} ({len(read)} pybind11 "
              f"signatures; allowlists: {', '.join(allowlists)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
