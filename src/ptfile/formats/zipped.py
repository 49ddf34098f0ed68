"""The ZIP checkpoint format of ``torch.save`` (torch >= 1.6): read and write.

Layout (see ``pt-format.md`` §2 to §6; verified against torch 2.13):

* All records live under one folder, the *prefix*: the target file's stem, or
  ``archive`` for file objects and non-ASCII paths.  Readers MUST take the
  prefix from the first central-directory entry and MUST ignore extra records.
* ``data.pkl`` — a pickle of the object (protocol 2 by default, 2 to 5 when
  asked, as written by CPython's C pickler); every storage is a
  persistent id ``('storage', <storage class>, key, location, numel)`` where
  ``numel`` counts elements of a typed storage and bytes of ``UntypedStorage``.
* ``data/<key>`` — the raw bytes of each storage, exactly ``numel * itemsize``.
* ``version`` (or ``.data/version``) — decimal format version, 1..10 readable.
* ``byteorder`` — ``little`` or ``big``; when missing, the configured default
  (:func:`ptfile.set_default_load_endianness`; little unless set).
* ``.format_version``, ``.storage_alignment``, ``.data/serialization_id``.

A writer MUST emit, in order: ``data.pkl``, ``.format_version`` (``1``),
``.storage_alignment``, ``byteorder`` (unless disabled), ``data/0``…``data/N``
in key order, ``version`` (``3\\n``), ``byteorder`` if it was disabled above
(torch 2.13 moves the record rather than dropping it), then
``.data/serialization_id``; with every payload aligned by the "FB" padding
extra field.  Storage keys are assigned in first-encounter order while
pickling, so the output is byte-identical to ``torch.save`` of the same object.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .._gc import paused_gc
from .._io.local import Source
from .._io.paths import is_path, is_url
from ..allowlist.policy import FindClass
from ..allowlist.reduction import PERSISTENT_TYPES, Reducer, ordered_bytes
from ..archive import ZipReader, ZipWriter
from ..config import Settings
from ..errors import FormatError, SaveError
from ..model.tensor import Storage
from ..picklevm import unpickle
from ..picklevm.pickler import Pickler
from .detection import Detected, Format
from .options import Opened, ReadOptions
from .policies import make
from .storages import FastStorages, StorageLoader
from .zipinfo import ZipInfo, read_info

__all__ = ["Fill", "archive_prefix", "open_zip", "read_zip", "write_zip", "zip_meta"]

#: The bytes of a storage without data, in pieces (:func:`write_zip`'s ``fill``).
Fill = Callable[[Storage], Iterable[Any]]


def archive_prefix(f: object) -> str:
    """torch's archive folder name: the file's stem for ASCII paths (and URLs), else
    ``archive``."""
    if not is_path(f) and not is_url(f):
        return "archive"
    name: str = os.path.basename(os.fspath(f).split("?")[0])  # type: ignore[call-overload]
    if not name.isascii():
        return "archive"
    stem = name[: name.rfind(".")] if "." in name else name
    if not stem:
        raise SaveError(f"invalid file name {name!r}: torch derives the archive folder from the "
                        "file name's stem, which is empty")
    return stem


def read_zip(source: Source, detected: Detected, options: ReadOptions) -> Any:
    """Unpickle the ``data.pkl`` of a torch ZIP checkpoint; storages are views of ``source``.

    Raises
    ------
    FormatError
        A metadata record or ``data.pkl`` is missing or malformed.
    StorageError
        A storage record disagrees with its persistent id.
    UnsafeGlobalError
        ``options.policy`` refused a global.
    """
    reader = detected.zip_reader()
    with paused_gc():  # the records' table and the objects: no garbage
        info = read_info(reader, options.settings)
        calculate = options.settings.calculate_storage_offsets
        loader: Callable[[object], Storage]
        find_class = make(options.policy, bulk=options.is_plain)
        if options.is_plain:
            loader = FastStorages(reader, source, info, skip_data=options.skip_data,
                                  calculate_offsets=calculate)
        else:
            loader = StorageLoader(reader, source, info, map_location=options.map_location,
                                   skip_data=options.skip_data, calculate_offsets=calculate)
        return _unpickle_data(reader, info, options, find_class, loader)


def open_zip(source: Source, detected: Detected, options: ReadOptions) -> Opened:
    """:func:`read_zip` without any storage's bytes: the opener of :func:`ptfile.open`.
    The object (storages without data), the archive's metadata records (also as
    :func:`zip_meta`), and which central directory row each storage came from (for
    their offsets).  ``options``: the limits, the settings and the policy (torch's
    weights-only one, or another); no storage is read whatever ``skip_data`` says.

    Raises
    ------
    FormatError, StorageError, UnsafeGlobalError
        As :func:`read_zip`.
    """
    reader = detected.zip_reader()
    with paused_gc():  # the records' table and the objects: no garbage
        info = read_info(reader, options.settings)
        loader = FastStorages(reader, source, info, skip_data=True)
        find_class = make(options.policy, bulk=True)
        obj = _unpickle_data(reader, info, options, find_class, loader)
    return Opened(source, Format.ZIP, obj, zip_meta(info), archive=reader, info=info,
                  by_row=loader.by_row)


def zip_meta(info: ZipInfo) -> dict[str, str]:
    """The metadata records of a ZIP kind as :meth:`ptfile.CheckpointReader.metadata`
    gives them (strings)."""
    meta = {"format": Format.ZIP.value, "version": str(info.version),
            "byteorder": info.byteorder, "storage_alignment": str(info.storage_alignment),
            "prefix": info.prefix}
    if info.format_version is not None:
        meta["format_version"] = str(info.format_version)
    if info.serialization_id is not None:
        meta["serialization_id"] = info.serialization_id
    return meta


def _unpickle_data(reader: ZipReader, info: ZipInfo, options: ReadOptions,
                   find_class: FindClass, loader: Callable[[object], Storage]) -> Any:
    """The object of the archive's ``data.pkl``, its storages made by ``loader``."""
    data_name = f"{info.prefix}/data.pkl"
    if reader.get(data_name) is None:
        raise FormatError("the archive has no data.pkl record", member=data_name)
    obj, _ = unpickle(reader.read(data_name), find_class=find_class, persistent_load=loader,
                      limits=options.limits, encoding=options.encoding)
    return obj


# --------------------------------------------------------------------------- writing

def write_zip(obj: object, write: Callable[[Any], Any], prefix: str, settings: Settings, *,
              pickle_protocol: int = 2, byteorder: str = sys.byteorder,
              skip_data: bool = False, fill: Fill | None = None) -> None:
    """Write ``obj`` as torch.save would, through ``write`` (storages streamed, not joined).

    ``byteorder`` (``"little"``/``"big"``) is the order of the storage bytes and
    of the ``byteorder`` record; the host's by default, as torch writes.
    ``skip_data`` writes every storage record as zeros with CRC 0, as torch's
    ``serialization.skip_data()`` does: the layout is final, the bytes are
    filled in later (e.g. through a shared map of the file).  ``fill`` gives the bytes
    of each storage made without data (``Storage(None, dtype, nbytes=n)``), in pieces
    written as they come, one record at a time (:mod:`ptfile.dcp.consolidate` streams a
    consolidated checkpoint so): the output is that of the same storages with data.
    """
    if byteorder not in ("little", "big"):
        raise ValueError(f"byteorder must be 'little' or 'big', got {byteorder!r}")
    reducer = Reducer()
    pickler = Pickler(pickle_protocol, reducer=reducer.reduce, persistent_id=reducer.persistent_id,
                      persistent_types=PERSISTENT_TYPES)
    with paused_gc():  # ~10 objects per tensor and record, none of them garbage
        _write_archive(pickler.dump(obj), reducer, write, prefix, settings, byteorder, skip_data,
                       fill)


def _write_archive(data: bytes, reducer: Reducer, write: Callable[[Any], Any], prefix: str,
                   settings: Settings, byteorder: str, skip_data: bool,
                   fill: Fill | None = None) -> None:
    """The records of :func:`write_zip`, in torch's order, ``data`` being ``data.pkl``."""
    writer = ZipWriter(write, prefix, alignment=settings.storage_alignment, crc32=settings.crc32)
    head = [("data.pkl", data), (".format_version", b"1"),
            (".storage_alignment", str(settings.storage_alignment).encode())]
    order = [("byteorder", byteorder.encode())]
    writer.write_records(head + order if settings.byteorder_record else head)
    if skip_data:
        for key, storage in enumerate(reducer.storages):
            writer.write_record_skip_data(f"data/{key}", storage.nbytes)
    elif fill is not None:
        for key, storage in enumerate(reducer.storages):
            if storage.data is None:
                writer.write_record_chunks(f"data/{key}", storage.nbytes, fill(storage))
            else:
                writer.write_record(f"data/{key}", ordered_bytes(
                    storage, reducer.swap_dtype_at(key), byteorder))
    else:
        writer.write_records(_storage_records(reducer, byteorder))
    writer.write_records([("version", b"3\n")] + ([] if settings.byteorder_record else order))
    writer.close()


def _storage_records(reducer: Reducer, byteorder: str) -> Iterator[tuple[str, memoryview]]:
    """``("data/<key>", bytes in byteorder)`` of every storage, in key order."""
    for key, storage in enumerate(reducer.storages):
        data = storage.data
        if data is None or storage.byteorder != byteorder:
            data = ordered_bytes(storage, reducer.swap_dtype_at(key), byteorder)
        yield f"data/{key}", data
