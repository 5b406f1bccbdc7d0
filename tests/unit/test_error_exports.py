"""Every adapter exports the same exception classes as ``hora`` itself, so
that ``except hvd.HoraTypeError`` reads the same whichever framework a
script imports (Horovod's adapters each export its classes too)."""

import importlib

import pytest

from hora.common import exceptions

CLASSES = ["HoraError", "HoraInternalError", "HoraInvalidArgumentError", "HoraMismatchError",
           "HoraShutdownError", "HoraTimeoutError", "HoraTypeError", "HorovodInternalError"]


@pytest.mark.parametrize("module", ["hora", "hora.torch", "hora.tensorflow", "hora.mxnet"])
def test_every_adapter_exports_hora_exception_classes(module):
    if module != "hora":
        pytest.importorskip(module.split(".")[1])
    adapter = importlib.import_module(module)
    for name in CLASSES:
        assert getattr(adapter, name, None) is getattr(exceptions, name), f"{module}.{name}"
        assert name in adapter.__all__, f"{name} missing from {module}.__all__"
