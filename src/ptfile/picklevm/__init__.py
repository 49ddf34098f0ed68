"""A restricted pickle machine: opcode table, exact stream checker, walker, unpickler.

This layer knows nothing about torch: the allowlist (``find_class``) and the
``persistent_load`` hook come from the caller.
"""

from __future__ import annotations

from .decoder import Op, genops
from .lexer import StreamInfo, check_stream
from .opcodes import BY_CODE, BY_NAME, OPCODES, ArgKind, Opcode
from .unpickler import unpickle

__all__ = [
    "BY_CODE",
    "BY_NAME",
    "OPCODES",
    "ArgKind",
    "Op",
    "Opcode",
    "StreamInfo",
    "check_stream",
    "genops",
    "unpickle",
]
