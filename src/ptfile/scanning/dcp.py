"""Scanning a DCP directory: its metadata pickles and every pickled non-tensor item.

A ``torch.distributed.checkpoint`` directory holds pickles in two places that torch runs
without a weights-only unpickler (``../shared/spec/dcp-format.md`` §2, §7.2): the
``.metadata`` files (``pickle.load``) and the non-tensor (bytes) items, each a
``torch.save`` ZIP that ``DefaultLoadPlanner`` loads with ``weights_only=False``.  Each is
scanned as a file of its own by the scanner; findings are located as ``.metadata:…`` or
``<file>@<offset>(<fqn>):…``.  In ``.metadata`` the names the DCP policy resolves
(:func:`ptfile.formats.policies.dcp`: torch's DCP dataclasses, ``torch.Size``, dtypes…)
are allowed; anything else keeps the scanner's verdict, so ``os.system`` there is
dangerous.  Tensor chunks are loaded weights-only by torch and are not scanned (their
bytes are the bulk of the checkpoint).  Metadata that cannot be read is a ``format``
finding of verdict ``unknown``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from .._io.directory import DirectoryFiles
from ..dcp.items import ItemKind, blob_header, item_bytes, stored_items
from ..dcp.load import load_metadata
from ..errors import FormatError, PtfileError
from ..formats import policies
from ..formats.detection import InputKind, folder_kind
from ..limits import Limits
from .verdicts import Finding, ScanResult, Verdict

__all__ = ["scan_directory"]

ScanBytes = Callable[[bytes], ScanResult]


def _resolves_in_dcp(module: str, name: str) -> bool:
    try:
        policies.dcp()(module, name)
    except PtfileError:
        return False
    return True


def _located(result: ScanResult, where: str, metadata: bool) -> list[Finding]:
    out = []
    for f in result.findings:
        verdict = f.verdict
        if metadata and f.kind == "global" and _resolves_in_dcp(f.module, f.name):
            verdict = Verdict.ALLOWED
        out.append(dataclasses.replace(f, location=f"{where}:{f.location}", verdict=verdict))
    return out


def scan_directory(directory: str | os.PathLike[str], scan_bytes: ScanBytes, *,
                   limits: Limits, storage_options: Mapping[str, Any] | None = None
                   ) -> ScanResult:
    """The findings of every metadata pickle and bytes item of a DCP directory.

    Raises
    ------
    FormatError
        ``directory`` is not a directory, cannot be listed, or is a folder of many files
        (:func:`~ptfile.formats.detection.folder_kind`), not one checkpoint.
    RemoteError
        A URL cannot be read.
    """
    findings: list[Finding] = []
    with DirectoryFiles(directory, storage_options=storage_options, limits=limits) as files:
        if folder_kind(files.names()) is InputKind.FOLDER:
            raise FormatError(f"{os.fspath(directory)!r} is a folder of many files, not one "
                              "checkpoint: scan them in bulk (ptfile.bulk.scan, or the "
                              "command line's scan of the folder)")
        for name in files.names():
            if name.endswith(".metadata"):
                result = scan_bytes(files.read_whole(name, name))
                findings += _located(result, name, metadata=True)
        try:
            meta = load_metadata(files, limits)
            for fqn, kind, info in stored_items(meta):  # values first
                if kind is ItemKind.SAFETENSORS_ENTRY:  # its blob's header, bounded
                    blob_header(files, fqn, info)
                if kind is not ItemKind.VALUE:
                    continue
                data = item_bytes(files, fqn, info, limits.max_pickle_bytes)
                where = f"{info.relative_path}@{info.offset}({fqn})"
                findings += _located(scan_bytes(bytes(data)), where, metadata=False)
        except PtfileError as exc:
            findings.append(Finding("format", Verdict.UNKNOWN, "directory", None,
                                    message=f"the DCP checkpoint cannot be read whole: "
                                    f"{type(exc).__name__}: {exc!s:.300}"))
    return ScanResult(os.fspath(directory), "dcp", tuple(findings))
