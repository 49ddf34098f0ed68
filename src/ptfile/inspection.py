"""What is in a checkpoint, whether it is intact, how two differ: :func:`inspect`, :func:`verify`, :func:`diff`.

These are the data models behind ``ptfile inspect``, ``ptfile verify`` and
``ptfile diff``; each result has ``to_dict()`` for JSON.  :func:`inspect` reads
no tensor data (the pickle and the ZIP headers only).  :func:`verify` reads
everything once, in chunks, to check CRCs.  :func:`diff` compares values in
bounded chunks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from ._io import FileLike
from ._remote import StorageOptions
from .archive import ZipReader
from .dcp_reader import DCPReader
from .errors import PtfileError, UnsafeGlobalError
from .limits import Limits
from .opening import open as open_checkpoint
from .reader import CheckpointReader, TensorInfo
from .tensor import Tensor

__all__ = ["DiffReport", "Inspection", "Problem", "RecordRow", "VerifyReport", "diff",
           "inspect", "verify"]

#: Elements compared per step in :func:`diff` (bounded memory on huge tensors).
DIFF_CHUNK: Final = 1 << 22
Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class RecordRow:
    """One ZIP member: where its header and data are, its size and recorded CRC-32."""

    name: str
    header_offset: int
    data_offset: int
    size: int
    crc32: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"name": self.name, "header_offset": self.header_offset,
                "data_offset": self.data_offset, "size": self.size, "crc32": f"{self.crc32:08x}"}


def _describe(obj: object, names: dict[int, str], depth: int = 0) -> Any:
    """A JSON-ready outline of the object tree; tensors by their dotted name."""
    if isinstance(obj, Tensor):
        return {"tensor": names.get(id(obj), "?")}
    if depth > 64:
        return {"type": type(obj).__name__, "truncated": True}
    if isinstance(obj, dict):
        return {"type": type(obj).__name__,
                "items": {str(k): _describe(v, names, depth + 1) for k, v in obj.items()}}
    if isinstance(obj, (list, tuple)):
        return {"type": type(obj).__name__, "items": [_describe(v, names, depth + 1) for v in obj]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"type": type(obj).__name__, "value": obj if not isinstance(obj, str) else obj[:200]}
    return {"type": type(obj).__name__, "repr": repr(obj)[:200]}


@dataclass
class Inspection:
    """Everything :func:`inspect` found: metadata, records, tensors, the tree and totals."""

    path: str | None
    format: str
    file_size: int
    metadata: dict[str, str]
    records: list[RecordRow]
    tensors: list[TensorInfo]
    tree: Any
    shared: dict[str, list[str]] = field(default_factory=dict)
    #: A DCP checkpoint's chunks by tensor (offsets, sizes, file, offset, length).
    chunks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def totals(self) -> dict[str, Any]:
        """Tensor count, parameter count (elements of distinct views), storage bytes by dtype."""
        views = {(t.storage_key, t.storage_offset, t.shape, t.stride, t.dtype.name): t
                 for t in self.tensors}
        storages: dict[str, tuple[str, int]] = {}
        for t in self.tensors:
            if t.storage_key is not None:
                storages.setdefault(t.storage_key, (t.dtype.name, t.storage_nbytes))
        by_dtype: dict[str, int] = {}
        for dtype, nbytes in storages.values():
            by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
        return {"tensors": len(self.tensors), "parameters": sum(t.numel for t in views.values()),
                "storages": len(storages), "storage_bytes": sum(by_dtype.values()),
                "bytes_by_dtype": dict(sorted(by_dtype.items(), key=lambda kv: -kv[1]))}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form of the whole inspection."""
        return {"path": self.path, "format": self.format, "file_size": self.file_size,
                "metadata": self.metadata, "totals": self.totals,
                "records": [r.to_dict() for r in self.records],
                "tensors": [t.to_dict() for t in self.tensors],
                "shared_storages": self.shared, "tree": self.tree,
                **({"chunks": self.chunks} if self.chunks else {})}


def _records(ck: CheckpointReader | DCPReader) -> list[RecordRow]:
    reader = ck.zip_reader
    if reader is None or isinstance(ck, DCPReader):
        return []
    return [RecordRow(r.name, r.header_offset, ck.record_data_offset(r), r.size, r.crc32)
            for r in reader.records]


def _inspection(ck: CheckpointReader | DCPReader, path: str | None, size: int) -> Inspection:
    tensors = list(ck.infos())
    by_storage: dict[str, list[str]] = {}
    for t in tensors:
        if t.storage_key is not None:
            by_storage.setdefault(t.storage_key, []).append(t.name)
    names = {id(t): name for name, t in ck.tensors().items()}
    return Inspection(path=path, format=ck.format.value, file_size=size,
                      metadata=ck.metadata(), records=_records(ck), tensors=tensors,
                      tree=_describe(ck.object, names),
                      shared={k: v for k, v in by_storage.items() if len(v) > 1},
                      chunks=_chunks(ck))


def _chunks(ck: CheckpointReader | DCPReader) -> dict[str, list[dict[str, Any]]]:
    """A DCP checkpoint's chunks per tensor (where each is stored); none for a file."""
    if not isinstance(ck, DCPReader):
        return {}
    return {name: [c.to_dict() for c in ck.chunks(name)] for name in ck}


def inspect(f: FileLike, *, limits: Limits | None = None,
            storage_options: StorageOptions = None, structural: bool = False) -> Inspection:
    """Describe a checkpoint without reading any tensor data.

    Parameters
    ----------
    f
        A path, a seekable binary file object, or a URL (only its metadata is fetched).
    limits
        Ceilings for untrusted input.
    storage_options
        For a URL: fsspec's options for its backend.
    structural
        Open a file whose pickle names globals outside the weights-only
        allowlist (a whole pickled module) with inert stand-ins, as
        :func:`ptfile.open` does.

    Returns
    -------
    Inspection
        Metadata, the record table, every tensor's dtype/shape/stride/storage
        and file offset, the object tree, shared storages and totals.

    Raises
    ------
    FormatError, UnsafeGlobalError, LimitExceededError, UnsupportedFeatureError
        As :func:`ptfile.open`.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.ones((2, 3), "float32")}, buf)
    >>> ptfile.inspect(io.BytesIO(buf.getvalue())).totals["parameters"]
    6
    """
    path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
    with open_checkpoint(f, limits=limits, storage_options=storage_options,
                         structural=structural) as ck:
        size = ck.source_size
        return _inspection(ck, path if isinstance(path, str) else None, size)


# --------------------------------------------------------------------------- verify


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
    if reader is None:
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


def verify(f: FileLike, *, limits: Limits | None = None, progress: Progress | None = None,
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
        The file cannot be opened (damage is reported, not raised).

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.ones(2, "float32")}, buf)
    >>> from ptfile.inspection import verify
    >>> verify(io.BytesIO(buf.getvalue())).ok
    True
    """
    path = os.fspath(f) if isinstance(f, (str, os.PathLike)) else None
    report = VerifyReport(path)
    try:
        with _open_for_verify(f, limits, storage_options, report) as ck:
            report.format = ck.format.value
            if isinstance(ck, DCPReader):
                _check_dcp(ck, report, progress)
            elif ck.zip_reader is not None:
                _check_records(ck.zip_reader, report, progress)
                _check_layout(ck, report)
            for name in ck:
                report.tensors_checked += 1
                ck.info(name)
    except PtfileError as exc:
        where = getattr(exc, "member", None) or "checkpoint"
        report.problems.append(Problem("error", str(where), f"{type(exc).__name__}: {exc}"))
    return report


@contextlib.contextmanager
def _open_for_verify(f: FileLike, limits: Limits | None, storage_options: StorageOptions,
                     report: VerifyReport) -> Iterator[CheckpointReader | DCPReader]:
    """:func:`ptfile.open` for checking: a pickle naming globals outside the weights-only
    allowlist is not damage; it is opened structurally (nothing runs) and reported as a
    warning that says torch's weights-only load refuses it."""
    position = None if isinstance(f, (str, os.PathLike)) else getattr(f, "tell", lambda: None)()
    try:
        ck = open_checkpoint(f, limits=limits, storage_options=storage_options)
    except UnsafeGlobalError as exc:
        report.problems.append(Problem(
            "warning", "pickle", f"not loadable with weights_only=True (it names "
            f"{exc.module}.{exc.name}, and maybe more: ptfile scan lists them); checked "
            "structurally, nothing was run"))
        if position is not None:
            f.seek(position)  # type: ignore[union-attr]
        ck = open_checkpoint(f, limits=limits, storage_options=storage_options, structural=True)
    with ck:
        yield ck


# --------------------------------------------------------------------------- diff


@dataclass
class DiffReport:
    """Keys added/removed, dtype/shape changes and the largest absolute difference per tensor."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, str] = field(default_factory=dict)
    max_abs_diff: dict[str, float] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        """True when both hold the same names, dtypes, shapes and values."""
        return not (self.added or self.removed or self.changed
                    or any(v != 0 for v in self.max_abs_diff.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN differences as the string ``"nan"``)."""
        values = {k: (v if not np.isnan(v) else "nan") for k, v in self.max_abs_diff.items()}
        return {"identical": self.identical, "added": self.added, "removed": self.removed,
                "changed": self.changed, "max_abs_diff": values}


def _max_abs(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    """max |a - b| in float64, in chunks of DIFF_CHUNK elements; NaN where they disagree on NaN."""
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    worst = 0.0
    for start in range(0, flat_a.size, DIFF_CHUNK):
        x = flat_a[start:start + DIFF_CHUNK].astype(np.float64)
        y = flat_b[start:start + DIFF_CHUNK].astype(np.float64)
        delta = np.abs(x - y)
        both_nan = np.isnan(x) & np.isnan(y)
        if np.isnan(delta[~both_nan]).any():
            return float("nan")
        delta[both_nan] = 0.0
        if delta.size:
            worst = max(worst, float(delta.max()))
    return worst


def _compare(a: CheckpointReader | DCPReader, b: CheckpointReader | DCPReader, name: str,
             report: DiffReport) -> None:
    x, y = a.info(name), b.info(name)
    if x.dtype != y.dtype or x.shape != y.shape:
        report.changed[name] = f"{x.dtype.name}{list(x.shape)} -> {y.dtype.name}{list(y.shape)}"
        return
    if x.dtype.numpy is None:
        return
    left, right = a.get_tensor(name), b.get_tensor(name)
    if x.dtype.is_complex:
        report.max_abs_diff[name] = max(_max_abs(left.real, right.real),
                                        _max_abs(left.imag, right.imag))
    else:
        report.max_abs_diff[name] = _max_abs(left, right)


def diff(a: FileLike, b: FileLike, *, limits: Limits | None = None,
         progress: Progress | None = None, storage_options: StorageOptions = None) -> DiffReport:
    """Compare two checkpoints tensor by tensor (dotted names, as :func:`ptfile.open`).

    Parameters
    ----------
    a, b
        Paths, seekable binary file objects or URLs (``storage_options`` for both).
    limits
        Ceilings for untrusted input.
    progress
        Called with 1 after each common tensor.

    Returns
    -------
    DiffReport

    Raises
    ------
    FormatError, UnsafeGlobalError, LimitExceededError, UnsupportedFeatureError
        As :func:`ptfile.open`.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> from ptfile.inspection import diff
    >>> x, y = io.BytesIO(), io.BytesIO()
    >>> ptfile.save({"w": np.zeros(2, "f4")}, x); ptfile.save({"w": np.ones(2, "f4")}, y)
    >>> diff(io.BytesIO(x.getvalue()), io.BytesIO(y.getvalue())).max_abs_diff
    {'w': 1.0}
    """
    report = DiffReport()
    with open_checkpoint(a, limits=limits, storage_options=storage_options) as left, \
            open_checkpoint(b, limits=limits, storage_options=storage_options) as right:
        report.removed = [k for k in left if k not in right]
        report.added = [k for k in right if k not in left]
        for name in left:
            if name in right:
                _compare(left, right, name, report)
                if progress is not None:
                    progress(1)
    return report

