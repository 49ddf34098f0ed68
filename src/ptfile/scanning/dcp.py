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

from ..dcp.items import ItemKind, blob_header, item_bytes, stored_items
from ..dcp.load import dcp_files, load_metadata
from ..errors import FormatError, PtfileError
from ..formats import policies
from ..formats.detection import InputKind, folder_kind
from ..formats.inputs import Input, is_checkpoint_name
from ..limits import Limits
from .verdicts import Finding, ScanResult, Verdict

__all__ = ["scan_directory", "scan_set", "scan_zero"]

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


def scan_set(record: Input, scan_file: Callable[[str], ScanResult]) -> ScanResult:
    """The findings of every checkpoint file of a checkpoint set (a ``.bin`` model folder,
    a trainer folder): each file is scanned whole, as the loaders read it by path, its
    findings located as ``<file>:…``.  A file that cannot be scanned (damaged) is a
    ``format`` finding of its own, so one bad file does not hide the others'."""
    findings: list[Finding] = []
    for name in record.names:
        if not is_checkpoint_name(name):
            continue
        try:
            result = scan_file(record.path(name))
        except FormatError as exc:
            findings.append(Finding("format", Verdict.UNKNOWN, name, getattr(exc, "offset", None),
                                    message=f"cannot scan: {exc!s:.300}"))
            continue
        findings += [dataclasses.replace(f, location=f"{name}:{f.location}")
                     for f in result.findings]
    return ScanResult(record.label, record.kind.value, tuple(findings))


def _is_deepspeed_class(module: str, name: str) -> bool:
    """Whether ``module.name`` is one of DeepSpeed's checkpoint classes ptfile reads as
    inert data (:mod:`ptfile.formats.deepspeed`)."""
    try:
        policies.deepspeed(policies.plain)(module, name)
    except PtfileError:
        return False
    return True


def scan_zero(record: Input, scan_file: Callable[[Any], ScanResult], *, limits: Limits,
              tags: bool = True) -> ScanResult:
    """The findings of every checkpoint file of a DeepSpeed ZeRO checkpoint: a tag folder's
    model and optimizer files, each scanned whole; for a run folder, with ``tags``, those of
    the tag folder ``latest`` names, located as ``<tag>/<file>:…`` (a whole-folder scan
    walks every tag folder instead: :mod:`ptfile.scanning.folders`).  DeepSpeed's own
    checkpoint classes (``ZeroStageEnum``, the loss scalers, ``fragment_address``), which
    ptfile reads as inert records, are allowed; anything else (a ``client_state`` object)
    keeps the scanner's verdict."""
    from ..zero.files import tag_folder

    location = str(record.location)
    folder, tag, names = location, "", list(record.names)
    if tags:
        try:
            folder, tag, names = tag_folder(location, names, None, record.storage_options,
                                            limits)
        except PtfileError:  # no latest: the folder's own files
            pass
    inner = Input(record.kind, record.given, folder, record.storage_options, tuple(names))
    findings: list[Finding] = []
    for f in scan_set(inner, scan_file).findings:
        if f.kind == "global" and f.verdict is not Verdict.ALLOWED \
                and _is_deepspeed_class(f.module, f.name):
            f = dataclasses.replace(f, verdict=Verdict.ALLOWED)
        where = f"{tag}/{f.location}" if tag and folder != location else f.location
        findings.append(dataclasses.replace(f, location=where))
    return ScanResult(record.label, record.kind.value, tuple(findings))


def scan_directory(directory: str | os.PathLike[str] | Input, scan_bytes: ScanBytes, *,
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
    with dcp_files(directory, storage_options, limits) as files:
        if folder_kind(files.names()) is InputKind.FOLDER:
            raise FormatError(f"{files.directory!r} is a folder of many files, not one "
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
    label = directory.label if isinstance(directory, Input) else str(os.fspath(directory))
    return ScanResult(label, "dcp", tuple(findings))
