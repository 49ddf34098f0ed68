"""What is in a checkpoint, whether it is intact, how two differ: :func:`inspect`, :func:`verify`, :func:`diff`.

These are the data models behind ``ptfile inspect``, ``ptfile verify`` and
``ptfile diff``; each result has ``to_dict()`` for JSON.  :func:`inspect` reads
no tensor data (the pickle and the ZIP headers only).  :func:`verify` reads
everything once, in chunks, to check CRCs.  :func:`diff` compares values in
bounded chunks.  Each lives in its module (:mod:`.describe`, :mod:`.checks`,
:mod:`.compare`); this face names them.
"""

from __future__ import annotations

from .checks import Problem, VerifyReport, verify
from .compare import DiffReport, diff
from .describe import Inspection, RecordRow, inspect

__all__ = ["DiffReport", "Inspection", "Problem", "RecordRow", "VerifyReport", "diff",
           "inspect", "verify"]
