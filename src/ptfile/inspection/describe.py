"""What is in a checkpoint: :func:`inspect` and its :class:`Inspection` (no tensor data is
read: the pickle, the ZIP headers, a folder's metadata)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from .._io.local import FileLike
from .._io.remote import StorageOptions
from ..api import open as open_checkpoint
from ..dcp.reader import DCPReader
from ..formats import Format
from ..formats.inputs import Input, resolve_input
from ..formats.pt2_program import ProgramSignature, read_program
from ..limits import DEFAULT_LIMITS, Limits
from ..model.tensor import Tensor
from ..reader import CheckpointReader, TensorInfo
from ..sets import SetReader
from ..zero import ZeroReader

__all__ = ["Inspection", "RecordRow", "inspect"]


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


