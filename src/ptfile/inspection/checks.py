"""Whether a checkpoint is intact: :func:`verify` reads everything once, in chunks, checking
CRCs, layouts, a folder's items and parts."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .._io.local import FileLike
from .._io.remote import StorageOptions
from ..api import open as open_checkpoint
from ..archive import ZipReader
from ..dcp.reader import DCPReader
from ..errors import (
    PtfileError,
    RemoteError,
    UnknownFormatError,
    UnsafeGlobalError,
    UnsupportedFeatureError,
)
from ..formats import Format
from ..formats.inputs import Input, resolve_input
from ..limits import Limits
from ..reader import CheckpointReader
from ..sets import SetReader
from ..zero import ZeroReader

__all__ = ["Problem", "VerifyReport", "verify"]

Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of :func:`verify`: ``error`` (damage) or ``warning`` (tolerated oddity)."""

    severity: str
    where: str
    message: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready fields."""
        return {"severity": self.severity, "where": self.where, "message": self.message}


@dataclass
class VerifyReport:
    """What :func:`verify` checked and found."""

    path: str | None
    format: str = "unknown"
    records_checked: int = 0
    bytes_checked: int = 0
    tensors_checked: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no error was found (warnings allowed)."""
        return not any(p.severity == "error" for p in self.problems)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"path": self.path, "format": self.format, "ok": self.ok,
                "records_checked": self.records_checked, "bytes_checked": self.bytes_checked,
                "tensors_checked": self.tensors_checked,
                "problems": [p.to_dict() for p in self.problems]}


def _check_records(reader: ZipReader, report: VerifyReport, progress: Progress | None) -> None:
    for record in reader.records:
        try:
            reader.data_offset(record)
            matches = reader.check_crc(record)
        except PtfileError as exc:
            report.problems.append(Problem("error", record.name, str(exc)))
            continue
        report.records_checked += 1
        report.bytes_checked += record.size
        if progress is not None:
            progress(record.size)
        if matches:
            continue
        if record.crc32 == 0:
            report.problems.append(Problem("warning", record.name, "no CRC-32 recorded (saved "
                                           "with CRC disabled or skip_data): bytes unchecked"))
        else:
            report.problems.append(Problem("error", record.name, f"CRC-32 mismatch: the central "
                                           f"directory says {record.crc32:08x}, the bytes give "
                                           "another value"))


def _check_dcp(ck: DCPReader, report: VerifyReport, progress: Progress | None) -> None:
    """Every item of a DCP checkpoint read once: tiling, item extents and contents."""
    def counted(n: int) -> None:
        report.records_checked += 1
        report.bytes_checked += n
        if progress is not None:
            progress(n)

    for severity, fqn, message in ck.check(counted):
        report.problems.append(Problem(severity, fqn, message))


def _check_layout(ck: CheckpointReader, report: VerifyReport) -> None:
    reader = ck.zip_reader
    if reader is None or ck.format is not Format.ZIP:  # a .pt2 keeps configs under data/
        return
    prefix = ck.metadata().get("prefix", "")
    for record in reader.records:
        key = record.name.removeprefix(f"{prefix}/data/")
        if key == record.name:
            continue
        if key not in ck.storage_keys:
            report.problems.append(Problem("warning", record.name,
                                           "storage record not referenced by data.pkl"))
        elif ck.computed_offset(record) != reader.data_offset(record):
            report.problems.append(Problem(
                "warning", record.name, "not torch's layout: torch.load(mmap=True) with "
                "calculate_storage_offsets would read the wrong bytes"))


def verify(f: FileLike | Input, *, limits: Limits | None = None, progress: Progress | None = None,
           storage_options: StorageOptions = None) -> VerifyReport:
    """Check a checkpoint: structure, every record's CRC-32, the pickle, every tensor's bounds.

    Parameters
    ----------
    f
        A path, a seekable binary file object, or a URL (every record is read: CRCs).
    limits
        Ceilings for untrusted input.
    progress
        Called with the number of bytes checked after each record.
    storage_options
        For a URL: fsspec's options for its backend.

    Returns
    -------
    VerifyReport
        ``ok`` is False when any error was found; each problem names the
        record or tensor and says what is wrong.

    Raises
    ------
    OSError
        The file cannot be opened.
    UnknownFormatError
        The file is no checkpoint at all (empty, random bytes, another format).
    UnsupportedFeatureError
        A checkpoint ptfile cannot read (TorchScript's ``model.json`` layout of torch
        1.0/1.1, a dtype it does not know): not verified, and not called damaged.
    RemoteError
        A URL cannot be read (not found, denied, unreachable).

    Damage in a checkpoint (a truncated archive, a CRC that does not match, a
    tensor beyond its storage, a pickle cut short) is reported, not raised.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.ones(2, "float32")}, buf)
    >>> from ptfile.inspection import verify
    >>> verify(io.BytesIO(buf.getvalue())).ok
    True
    """
    record = resolve_input(f, storage_options)
    path = os.fspath(record.given) if isinstance(record.given, (str, os.PathLike)) else None
    report = VerifyReport(path)
    try:
        with _open_for_verify(record, limits, report) as ck:
            report.format = ck.format.value
            for where, part in _checked_parts(ck):
                _check_part(part, where, report, progress)
            for name in ck:
                report.tensors_checked += 1
                ck.info(name)
    except (UnknownFormatError, RemoteError, UnsupportedFeatureError):
        # not a checkpoint, not reachable, or one ptfile cannot read (TorchScript's
        # model.json layout, an unknown dtype): nothing verified (exit 2), not damaged
        raise
    except PtfileError as exc:
        where = getattr(exc, "member", None) or "checkpoint"
        notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", ()))
        report.problems.append(Problem("error", str(where),
                                       f"{type(exc).__name__}: {exc}{notes}"))
    return report


def _checked_parts(ck: Any) -> list[tuple[str, Any]]:
    """The readers whose bytes verify checks: the checkpoint's own, or a set's parts
    (``.bin`` shards each), named by file."""
    if not isinstance(ck, SetReader):
        return [("", ck)]
    return ck.readers()


def _check_part(ck: Any, where: str, report: VerifyReport, progress: Progress | None) -> None:
    """A file's records and layout, or a DCP folder's items; problems named by ``where``
    (a set's file) before their own place."""
    first = len(report.problems)
    if isinstance(ck, DCPReader):
        _check_dcp(ck, report, progress)
    elif isinstance(ck, ZeroReader):  # each rank file's records, then each tensor assembled
        for name, archive in ck.archives():
            first_file = len(report.problems)
            _check_records(archive, report, progress)
            report.problems[first_file:] = [Problem(p.severity, f"{name}:{p.where}", p.message)
                                            for p in report.problems[first_file:]]
        report.problems += [Problem(*found) for found in ck.check()]
    elif ck.zip_reader is not None:
        _check_records(ck.zip_reader, report, progress)
        _check_layout(ck, report)
    if where:
        report.problems[first:] = [Problem(p.severity, f"{where}:{p.where}", p.message)
                                   for p in report.problems[first:]]


@contextlib.contextmanager
def _open_for_verify(f: Any, limits: Limits | None,
                     report: VerifyReport) -> Iterator[Any]:
    """:func:`ptfile.open` for checking: a pickle naming globals outside the weights-only
    allowlist is not damage; it is opened structurally (nothing runs) and reported as a
    warning that says torch's weights-only load refuses it."""
    given = f.location
    position = None if isinstance(given, (str, os.PathLike)) else \
        getattr(given, "tell", lambda: None)()
    try:
        ck = open_checkpoint(f, limits=limits)
    except UnsafeGlobalError as exc:
        report.problems.append(Problem(
            "warning", "pickle", f"not loadable with weights_only=True (it names "
            f"{exc.module}.{exc.name}, and maybe more: ptfile scan lists them); checked "
            "structurally, nothing was run"))
        if position is not None:
            given.seek(position)
        ck = open_checkpoint(f, limits=limits, structural=True)
    with ck:
        yield ck


# --------------------------------------------------------------------------- diff


