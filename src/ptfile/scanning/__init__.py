"""The static scanner: every pickle a checkpoint holds, with verdicts.  Nothing runs.

``scanner``     :func:`scan`: which pickles a file holds and how each is walked.
``verdicts``    :class:`Verdict`, the tables that decide it, :class:`Finding`, :class:`ScanResult`.
``containers``  ZIP and tar walks on the archive parsers' tolerant mode: members and anomalies.
``fast``        The fast path: CPython's unpickler fed inert stand-ins, for plainly clean streams.
``torchscript`` TorchScript archives: ``__torch__`` class references and ``code/`` records.
``lite``        The lite interpreter's program (``bytecode.pkl``): its operators and types.
``dcp``         DCP folders: metadata and bytes items, read where torch's reader reads them.
"""

from __future__ import annotations

from .scanner import scan
from .verdicts import (
    DANGEROUS_MODULES,
    DANGEROUS_NAMES,
    TORCHSCRIPT_NAMES,
    Finding,
    ScanResult,
    Verdict,
    iter_dangerous,
    verdict_of,
)

__all__ = [
    "DANGEROUS_MODULES",
    "DANGEROUS_NAMES",
    "TORCHSCRIPT_NAMES",
    "Finding",
    "ScanResult",
    "Verdict",
    "iter_dangerous",
    "scan",
    "verdict_of",
]
