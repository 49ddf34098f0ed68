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
bytes are the bulk of the checkpoint).

Items are read where torch's ``FileSystemReader`` reads them, ``<folder>/<relative_path>``
opened as the OS resolves it: a path that leaves the folder (``../x``, an absolute path)
is followed, its item scanned there, and reported as a dangerous ``archive`` finding
(``outside-folder``: no writer puts one there, and a gate on the folder does not see what
torch reads); a URL folder's is not followed (dangerous too).  Two ``storage_data``
entries of one item (equal ``fqn`` and ``offset``, which is all torch's ``MetadataIndex``
compares) are one to torch, whose dict keeps the last: so is the scan's.  Metadata or an
item that cannot be read is a ``format`` finding; a folder whose only findings are those
is damaged, no loader reads it: :func:`~.verdicts.raise_if_damaged` raises its
:class:`~ptfile.errors.FormatError` (exit 2), as for a single file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from .._io.directory import DirectoryFiles
from ..dcp.items import ItemKind, blob_header, item_bytes, stored_items
from ..dcp.load import dcp_files, load_metadata
from ..errors import FormatError, LimitExceededError, PtfileError
from ..formats import policies
from ..formats.dcp_metadata import StorageInfo
from ..formats.detection import InputKind, folder_kind
from ..formats.inputs import Input, is_checkpoint_name
from ..limits import Limits
from .verdicts import Finding, ScanResult, Verdict, raise_if_damaged

__all__ = ["scan_directory", "scan_set", "scan_zero"]

ScanBytes = Callable[[bytes], ScanResult]
#: The name of the finding of an item read from outside the checkpoint folder.
OUTSIDE: Final = "outside-folder"


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
    findings located as ``<file>:…``.  In a trainer folder, the names its parts hold by
    their role (:func:`~.allowing.role_allowed`: numpy's RNG state, Trainer's arguments)
    are allowed in those files.  A file that cannot be scanned (damaged) is a
    ``format`` finding of its own, so one bad file does not hide the others'."""
    from ..sets.reader import role_of
    from .allowing import role_allowed

    roles = {name: role_of(p) for p in record.parts for name in p.files} \
        if record.kind is InputKind.TRAINER else {}
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
        allowed = role_allowed(roles.get(name, ""))
        if allowed is not None:  # what the part's role says it holds, read as data
            result = allowed.apply(result)
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
        (:func:`~ptfile.formats.detection.folder_kind`), not one checkpoint; or it is
        damaged past reading (no loader reads it: its only findings say so).
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
        except PtfileError as exc:
            findings.append(_damage("directory", exc, "the DCP metadata cannot be read"))
        else:
            for fqn, kind, info in stored_items(meta):  # values first
                findings += _scan_item(files, fqn, kind, info, scan_bytes, limits)
    raise_if_damaged(findings)
    label = directory.label if isinstance(directory, Input) else str(os.fspath(directory))
    return ScanResult(label, "dcp", tuple(findings))


def _damage(where: str, exc: PtfileError, what: str) -> Finding:
    """The finding of what could not be read: damage (a ``format`` finding), or a ceiling
    of ``Limits`` hit (a ``limit`` finding, ``unknown``: not read, not damage)."""
    message = f"{what}: {type(exc).__name__}: {exc!s:.300}"
    if isinstance(exc, LimitExceededError):
        return Finding("limit", Verdict.UNKNOWN, where, getattr(exc, "offset", None), "",
                       exc.limit, message=message)
    return Finding("format", Verdict.UNKNOWN, where, getattr(exc, "offset", None),
                   message=message)


def _scan_item(files: DirectoryFiles, fqn: str, kind: ItemKind, info: StorageInfo,
               scan_bytes: ScanBytes, limits: Limits) -> list[Finding]:
    """One stored item, read where torch's ``FileSystemReader`` reads it
    (``<folder>/<relative_path>``, wherever that leads: :func:`_item_files`): a value's
    pickle scanned, a safetensors entry's header checked; damage is a ``format`` finding
    (the other items are still scanned)."""
    where = f"{info.relative_path}@{info.offset}({fqn})"
    found = _item_files(files, info, limits)
    if isinstance(found, str):
        return [Finding("archive", Verdict.DANGEROUS, where, info.offset, "", OUTSIDE,
                        message=found)]
    item_files, local, leaves = found
    out = [Finding("archive", Verdict.DANGEROUS, where, info.offset, "", OUTSIDE,
                   message=f"item {fqn!r} is read from {info.relative_path!r}, outside the "
                   "checkpoint folder: torch's FileSystemReader follows the path")
           ] if leaves else []
    try:
        with contextlib.nullcontext() if item_files is files else item_files:
            if kind is ItemKind.SAFETENSORS_ENTRY:  # its blob's header, bounded
                blob_header(item_files, fqn, local)
            if kind is ItemKind.VALUE:
                data = item_bytes(item_files, fqn, local, limits.max_pickle_bytes)
                out += _located(scan_bytes(bytes(data)), where, metadata=False)
    except PtfileError as exc:
        out.append(_damage(where, exc, f"item {fqn!r} cannot be read"))
    return out


def _item_files(files: DirectoryFiles, info: StorageInfo, limits: Limits
                ) -> tuple[DirectoryFiles, StorageInfo, bool] | str:
    """The files to read ``info`` from, ``info`` relative to them, and whether that
    leaves the checkpoint folder.  A name of the folder is read there; any other path
    from the folder that the OS resolves ``<folder>/<relative_path>`` to (``../x``,
    ``sub/x``, an absolute path: torch joins it with :class:`pathlib.Path` and opens it),
    with ``info`` renamed to its last part.  A URL's other paths are not followed: why,
    as a string."""
    name = info.relative_path
    if files.has(name):
        return files, info, False
    if files.is_remote:
        return (f"{name!r} is not a file of the checkpoint folder, which is a URL: not "
                "followed (torch's FileSystemReader would open it)")
    parent, base = os.path.split(os.path.join(files.directory, name))
    folder = os.path.realpath(files.directory)
    leaves = os.path.realpath(parent) != folder and \
        not os.path.realpath(parent).startswith(folder + os.sep)
    names = [base] if os.path.isfile(os.path.join(parent, base)) else []
    other = DirectoryFiles(parent or os.sep, limits=limits, names=names)
    return other, dataclasses.replace(info, relative_path=base), leaves
