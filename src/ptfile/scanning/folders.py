"""Scanning a checkpoint folder whole: its checkpoint as its kind, and every other file in
it and under it that one of torch's loaders reads.

A loader given a checkpoint folder reads its checkpoint's files only (a DCP folder's
metadata and items, a set's parts); ``torch.load`` opens any other file in it by path —
``checkpoint-500/sub/optimizer.pt``, ``extra.pt`` beside a DCP ``.metadata``,
``.cache/model.pt`` — so a gate over the folder judges those too.  The walk is
:func:`ptfile.formats.walk.walk_tree`'s (``inside``): nested checkpoint folders are read
as their kind, every other file a loader reads is scanned as a file, the rest are not
read past their first bytes.  Findings are located ``<path relative to the folder>:…``;
a file whose real path leaves the folder (a link) is located by its path in the folder
and gets a ``link`` finding of verdict ``allowed`` naming where it leads (reported, the
exit code is its scan's); a file that cannot be scanned (damaged) is a ``format`` finding of its own, as
in a set (:func:`ptfile.scanning.dcp.scan_set`), so one bad file hides no other's.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from typing import Any

from .._io.paths import is_url
from ..errors import FormatError
from ..formats.inputs import Input, resolve_input
from ..formats.walk import walk_tree
from .verdicts import Finding, ScanResult, Verdict

__all__ = ["scan_folder"]

#: Scans one input (a file, or a checkpoint folder as its kind only).
ScanOne = Callable[[Any], ScanResult]


def _relative(path: str, root: str) -> str:
    if is_url(root):
        return path[len(root.rstrip("/")) + 1:]
    return os.path.relpath(path, root).replace(os.sep, "/")


def _located(result: ScanResult, where: str) -> list[Finding]:
    return [dataclasses.replace(f, location=f"{where}:{f.location}") for f in result.findings]


def scan_folder(record: Input, scan_kind: ScanOne, scan_file: ScanOne) -> ScanResult:
    """The findings of the checkpoint folder ``record`` (``scan_kind``) and of everything
    under it a loader reads (module docstring)."""
    root = str(record.location)
    tree = walk_tree(root, storage_options=record.storage_options)
    own = scan_kind(record)
    findings = list(own.findings)
    for folder in tree.folders:
        if os.path.normpath(folder) == os.path.normpath(root) or folder == root:
            continue
        findings += _scanned(functools.partial(_kind_of, scan_kind, folder, record),
                             _relative(folder, root))
    for found in tree.files:
        where = _relative(found.path, root)
        if found.target is not None:
            findings.append(Finding("link", Verdict.ALLOWED, where, None,
                                    message=f"a link out of the folder, to {found.target}: "
                                    "a loader given this path reads that file"))
        findings += _scanned(functools.partial(scan_file, found.path), where)
    return ScanResult(own.source, own.format, tuple(findings))


def _kind_of(scan_kind: ScanOne, folder: str, record: Input) -> ScanResult:
    return scan_kind(resolve_input(folder, record.storage_options))


def _scanned(scan: Callable[[], ScanResult], where: str) -> list[Finding]:
    try:
        return _located(scan(), where)
    except FormatError as exc:
        return [Finding("format", Verdict.UNKNOWN, where, getattr(exc, "offset", None),
                        message=f"cannot scan: {exc!s:.300}")]
