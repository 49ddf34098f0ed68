"""What is in a checkpoint, whether it is intact, how two differ: :func:`inspect`, :func:`verify`, :func:`diff`.

These are the data models behind ``ptfile inspect``, ``ptfile verify`` and
``ptfile diff``; each result has ``to_dict()`` for JSON.  :func:`inspect` reads
no tensor data (the pickle and the ZIP headers only).  :func:`verify` reads
everything once, in chunks, to check CRCs.  :func:`diff` compares values in
bounded chunks.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from ._io.local import FileLike
from ._io.remote import StorageOptions
from .allowlist.structural import StandIn
from .api import open as open_checkpoint
from .archive import ZipReader
from .dcp.reader import DCPReader
from .errors import (
    PtfileError,
    RemoteError,
    UnknownFormatError,
    UnsafeGlobalError,
    UnsupportedFeatureError,
)
from .formats import Format
from .formats.inputs import Input, InputKind, resolve_input
from .formats.pt2_program import ProgramSignature, read_program
from .limits import DEFAULT_LIMITS, Limits
from .model.tensor import Tensor
from .model.tree import containers
from .model.tree import values as values_of
from .reader import CheckpointReader, TensorInfo
from .sets import SetReader
from .zero import ZeroReader

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
    """Everything :func:`inspect` found: metadata, records, tensors, the tree and totals;
    for a ``.pt2``, the exported program's signature (``program``)."""

    path: str | None
    format: str
    file_size: int
    metadata: dict[str, str]
    records: list[RecordRow]
    tensors: list[TensorInfo]
    tree: Any
    shared: dict[str, list[str]] = field(default_factory=dict)
    #: A ``.pt2``'s exported program: its inputs, outputs, parameters, buffers, constants.
    program: ProgramSignature | None = None
    #: A DCP checkpoint's chunks by tensor (offsets, sizes, file, offset, length); a ZeRO
    #: checkpoint's rank pieces, so described.
    chunks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: A ZeRO checkpoint's layout (:meth:`ptfile.zero.ZeroReader.summary`).
    zero: dict[str, Any] = field(default_factory=dict)
    #: A checkpoint set's parts (:mod:`ptfile.sets`): role, files, format, tensors and
    #: totals of each; the set's ``tensors`` and ``totals`` are over every part.
    parts: list[dict[str, Any]] = field(default_factory=list)

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
                **({} if self.program is None else {"program": self.program.to_dict()}),
                **({"chunks": self.chunks} if self.chunks else {}),
                **({"zero": self.zero} if self.zero else {}),
                **({"parts": self.parts} if self.parts else {})}


def _records(ck: Any) -> list[RecordRow]:
    reader = ck.zip_reader
    if reader is None or isinstance(ck, DCPReader):
        return []
    return [RecordRow(r.name, r.header_offset, ck.record_data_offset(r), r.size, r.crc32)
            for r in reader.records]


def _program(ck: Any, limits: Limits) -> ProgramSignature | None:
    """The signature of a ``.pt2``'s program (read from its JSON; nothing runs)."""
    if ck.format is not Format.PT2 or ck.zip_reader is None:
        return None
    return read_program(ck.zip_reader, ck.metadata()["prefix"], limits)


def _inspection(ck: CheckpointReader | DCPReader | SetReader | ZeroReader, path: str | None, size: int,
                limits: Limits = DEFAULT_LIMITS) -> Inspection:
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
                      program=_program(ck, limits), chunks=_chunks(ck), parts=_parts(ck),
                      zero=ck.summary() if isinstance(ck, ZeroReader) else {})


def _parts(ck: Any) -> list[dict[str, Any]]:
    """A checkpoint set's parts, each described on its own (none for one checkpoint)."""
    if not isinstance(ck, SetReader):
        return []
    out = []
    for part in ck.record.parts:
        reader = ck.parts.get(part.role)
        row: dict[str, Any] = {"role": part.role, "files": list(part.files),
                               "form": part.form}
        if reader is None or not hasattr(reader, "infos"):
            row["format"] = "json" if part.form == "json" else "unread"
            row["totals"] = {"tensors": 0}
        else:
            infos = list(reader.infos())
            row["format"] = reader.metadata().get("format", reader.format.value)
            row["totals"] = Inspection(None, row["format"], 0, {}, [], infos, None).totals
        out.append(row)
    return out


def _chunks(ck: Any) -> dict[str, list[dict[str, Any]]]:
    """A DCP checkpoint's chunks per tensor (where each is stored), a ZeRO checkpoint's
    pieces; none for a file."""
    if not isinstance(ck, (DCPReader, ZeroReader)):
        return {}
    return {name: [c.to_dict() for c in ck.chunks(name)] for name in ck}


def inspect(f: FileLike | Input, *, limits: Limits | None = None,
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
        and file offset, the object tree, shared storages and totals; for a
        ``.pt2``, ``program``: its inputs, outputs, parameters, buffers,
        constants and custom objects, read from its JSON (nothing is run).

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
    record = resolve_input(f, storage_options)
    path = os.fspath(record.given) if isinstance(record.given, (str, os.PathLike)) \
        else getattr(record.given, "name", None)
    with open_checkpoint(record, limits=limits, structural=structural) as ck:
        size = ck.source_size
        return _inspection(ck, path if isinstance(path, str) else None, size,
                           limits or DEFAULT_LIMITS)


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


@dataclass
class DiffReport:
    """What differs between two checkpoints: names only in one of them (tensors and other
    values), tensors whose dtype or shape changed, other values that changed, and the
    largest absolute difference per common tensor."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: dict[str, str] = field(default_factory=dict)
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    #: Non-tensor values (``step``, ``config.lr``) that differ: name -> [a, b], as ``repr``.
    values_changed: dict[str, list[str]] = field(default_factory=dict)
    #: Non-tensor values compared (0 with ``tensors_only``).
    values_compared: int = 0
    #: Containers (non-empty dicts, lists, tuples) whose kind differs or that only one
    #: side has: name -> [kind in a, kind in b], None where absent (``{"model": {"w": t}}``
    #: against ``{"model.w": t}``: ``{"model": ["dict", None]}``).
    structure: dict[str, list[str | None]] = field(default_factory=dict)
    #: The two inputs, as given (None for file objects).
    a: str | None = None
    b: str | None = None

    @property
    def identical(self) -> bool:
        """True when both hold the same names, dtypes, shapes and values, tensors and
        other values alike."""
        return not (self.added or self.removed or self.changed or self.values_changed
                    or self.structure or any(v != 0 for v in self.max_abs_diff.values()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (NaN differences as the string ``"nan"``)."""
        values = {k: (v if not np.isnan(v) else "nan") for k, v in self.max_abs_diff.items()}
        return {"a": self.a, "b": self.b, "identical": self.identical, "added": self.added,
                "removed": self.removed, "changed": self.changed, "max_abs_diff": values,
                "values_changed": self.values_changed,
                "values_compared": self.values_compared, "structure": self.structure}


#: Characters of a value's ``repr`` a diff report keeps.
_VALUE_REPR: Final = 80


def _values(ck: Any) -> dict[str, object]:
    """The checkpoint's non-tensor values by dotted name (a DCP item is read now; a set's
    by part, named as its tensors are)."""
    if isinstance(ck, SetReader):
        prefixed = ck.record.kind is InputKind.TRAINER
        out: dict[str, object] = {}
        for role, part in ck.parts.items():
            found = _values(part) if hasattr(part, "info") else values_of(part)
            out.update({(f"{role}.{k}" if k else role) if prefixed else k: v
                        for k, v in found.items()})
        return out
    if isinstance(ck, DCPReader):  # an item may hold a list or dict: named leaf by leaf
        return {f"{fqn}.{k}" if k else fqn: v
                for fqn in ck.meta.state_dict_metadata if fqn not in ck
                for k, v in values_of(ck.value(fqn)).items()}
    # A structural load's stand-ins are no values (a fresh class per load): their tensors
    # are compared by state-dict name, the rest of the object is not.
    return {k: v for k, v in values_of(ck.object).items() if not isinstance(v, StandIn)}


def _compare_structure(left: Any, right: Any, report: DiffReport) -> None:
    """Containers that differ in kind or that one side lacks (files only: a DCP folder's
    nesting is rebuilt from its planner data, tuples as lists)."""
    if isinstance(left, DCPReader) or isinstance(right, DCPReader):
        return
    a, b = containers(left.object), containers(right.object)
    for name in dict.fromkeys([*a, *b]):
        if a.get(name) != b.get(name):
            report.structure[name] = [a.get(name), b.get(name)]


def _same(x: object, y: object) -> bool:
    """Equal values of one type (NaN equals NaN; arrays element-wise; a value whose ``==``
    fails compares by ``repr``)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    try:
        equal: Any = x == y  # an array's == is an array
        return bool(equal) if isinstance(equal, (bool, np.bool_)) else \
            bool(np.all(np.asarray(equal)))
    except Exception:  # noqa: BLE001 - an inert stand-in's or an odd type's comparison
        return repr(x) == repr(y)


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _VALUE_REPR else text[:_VALUE_REPR - 1] + "…"


def _compare_values(left: dict[str, object], right: dict[str, object],
                    report: DiffReport) -> None:
    report.removed += [k for k in left if k not in right]
    report.added += [k for k in right if k not in left]
    for name, x in left.items():
        if name in right:
            report.values_compared += 1
            if not _same(x, right[name]):
                report.values_changed[name] = [_short(x), _short(right[name])]


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


def _compare(a: Any, b: Any, name: str,
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
         progress: Progress | None = None, storage_options: StorageOptions = None,
         tensors_only: bool = False, structural: bool = False) -> DiffReport:
    """Compare two checkpoints: tensor by tensor (dotted names, as :func:`ptfile.open`),
    then every other value (``step``, a config dict's entries, as :func:`ptfile.model.tree.values`
    names them), then the nesting (the containers by name and kind: a nested object and
    its flattening differ).  Any two inputs :func:`ptfile.open` reads compare: a ``.pt`` with its
    ``.safetensors`` conversion, a DCP folder with the file consolidated from it.

    Parameters
    ----------
    a, b
        Paths, seekable binary file objects or URLs (``storage_options`` for both).
    limits
        Ceilings for untrusted input.
    progress
        Called with 1 after each common tensor.
    tensors_only
        Compare tensors only: values other than tensors and the nesting are neither
        compared nor listed as added or removed (a foreign ``.safetensors`` file holds no
        ``step``, and its names are flat).
    structural
        Open pickles that name globals outside the weights-only allowlist with inert
        stand-ins (:func:`ptfile.open`'s ``structural``).

    Returns
    -------
    DiffReport

    Raises
    ------
    FormatError, UnsafeGlobalError, LimitExceededError, UnsupportedFeatureError
        As :func:`ptfile.open`; the message starts with the input that failed.

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> from ptfile.inspection import diff
    >>> x, y = io.BytesIO(), io.BytesIO()
    >>> ptfile.save({"w": np.zeros(2, "f4"), "step": 1}, x)
    >>> ptfile.save({"w": np.ones(2, "f4"), "step": 2}, y)
    >>> report = diff(io.BytesIO(x.getvalue()), io.BytesIO(y.getvalue()))
    >>> report.max_abs_diff, report.values_changed
    ({'w': 1.0}, {'step': ['1', '2']})
    """
    report = DiffReport(a=_named(a), b=_named(b))
    with _opened(a, limits, storage_options, structural) as left, \
            _opened(b, limits, storage_options, structural) as right:
        report.removed = [k for k in left if k not in right]
        report.added = [k for k in right if k not in left]
        for name in left:
            if name in right:
                _compare(left, right, name, report)
                if progress is not None:
                    progress(1)
        if not tensors_only:
            _compare_values(_values(left), _values(right), report)
            _compare_structure(left, right, report)
    return report


def _named(f: FileLike) -> str | None:
    return str(os.fspath(f)) if isinstance(f, (str, os.PathLike)) else None


@contextlib.contextmanager
def _opened(f: FileLike, limits: Limits | None, storage_options: StorageOptions,
            structural: bool) -> Iterator[CheckpointReader | DCPReader | SetReader | ZeroReader]:
    """:func:`ptfile.open`, with the input's name added to the error it raises: a diff
    reads two inputs, and the user must know which one failed."""
    try:
        ck = open_checkpoint(f, limits=limits, storage_options=storage_options,
                             structural=structural)
    except PtfileError as exc:
        name = _named(f)
        if name is not None:
            exc.args = (f"{name}: {exc.args[0]}" if exc.args else name, *exc.args[1:])
            exc.input = name  # type: ignore[attr-defined]  # which of the two, for the CLI
        raise
    with ck:
        yield ck

