"""Where a collective was submitted from, for mismatch errors.

At ``HORA_LOG_LEVEL=debug`` (or trace) every submission carries the first
stack frame outside hora (``train.py:42 in step``), and a mismatch error
names each rank's call site. Off otherwise: walking the stack costs a few
microseconds per call.
"""
import os
import sys

from hora._loader import _C

_HORA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Read on every submission, so a plain module attribute rather than a call.
recording = False


def refresh():
    """Reads the engine's log level; called by ``init()``."""
    global recording
    recording = bool(_C.records_call_sites())


def describe():
    """'file:line in function' of the caller outside hora, or '' when off."""
    if not recording:
        return ""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_HORA_DIR):
        frame = frame.f_back
    if frame is None:
        return ""
    code = frame.f_code
    return f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}"
