"""ZipWriter: ZIP archives byte-identical to ``torch.save``'s, through a write callable.

The layout is specified in :mod:`ptfile.archive.records` ("Writers"); the
``.data/serialization_id`` record in :mod:`ptfile.archive.serialization_id`.
The writer only ever appends: it works on pipes and sockets, counts its own
position, and passes payloads to ``write`` as they come (a payload is never
joined with its header or buffered whole).  Like torch's writer it refuses
data for names ending in ``/`` and ignores records the caller names
``.data/serialization_id``; :meth:`ZipWriter.close` always writes its own.

Per-record cost matters for checkpoints with 10^5-10^6 tensors, so the hot
path packs ``struct.Struct`` layouts directly instead of building one dataclass
per header (the tests check that the result parses back into the dataclasses of
:mod:`~ptfile.archive.records`), and :meth:`ZipWriter.write_records` gathers
small records into few ``write`` calls.  Large payloads are still passed
through as they come, never copied.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Final

from ._runs import fold_crcs, pack_run
from .layout import padding_extra, zip64_extra
from .records import (
    CENTRAL_DIRECTORY_SIGNATURE,
    CENTRAL_DIRECTORY_STRUCT,
    DATA_DESCRIPTOR_SIGNATURE,
    DESCRIPTOR64_STRUCT,
    DESCRIPTOR_STRUCT,
    DOS_DIRECTORY_ATTRIBUTE,
    EXTRA_HEADER_STRUCT,
    FLAG_DATA_DESCRIPTOR,
    FLAG_UTF8,
    LOCAL_FILE_HEADER_SIGNATURE,
    LOCAL_FILE_HEADER_STRUCT,
    METHOD_STORED,
    U16_MAX,
    U32_MAX,
    EndOfCentralDirectory,
    Zip64EndOfCentralDirectory,
    Zip64Locator,
)
from .serialization_id import SERIALIZATION_ID_NAME, fold_write, hash_combine, serialization_id

if TYPE_CHECKING:
    from typing_extensions import Buffer, Self

__all__ = [
    "BATCH_FLUSH_BYTES", "BATCH_PAYLOAD_BYTES", "MAX_ALIGNMENT", "PARALLEL_CRC_BYTES", "ZipWriter",
]


#: The padding extra is at most ``alignment - 1`` bytes of fill plus its 4-byte
#: header, next to a ZIP64 extra of up to 28 bytes; the extra length is a u16.
MAX_ALIGNMENT: Final = U16_MAX - 4 - 28 + 1
#: Zero-filled payloads (``skip_data``) are written in slices of this size.
ZERO_CHUNK_BYTES: Final = 1 << 20
_ZEROS: Final = bytes(ZERO_CHUNK_BYTES)
_LOCAL_SIZE: Final = LOCAL_FILE_HEADER_STRUCT.size
_EXTRA_HEADER_SIZE: Final = EXTRA_HEADER_STRUCT.size
#: Flags of a non-empty record: data descriptor follows, UTF-8 name.
_FLAGS: Final = FLAG_DATA_DESCRIPTOR | FLAG_UTF8
#: :meth:`ZipWriter.write_records` copies payloads smaller than this into its
#: batches; larger ones go to ``write`` as they are.
BATCH_PAYLOAD_BYTES: Final = 64 << 10
#: ... and hands a batch to ``write`` once it holds about this many bytes.
BATCH_FLUSH_BYTES: Final = 1 << 20
#: A record's bytes in a run besides its payload and padding: local header,
#: padding extra header, data descriptor, central entry, and a name's worth.
_HEAD_BYTES: Final = 30 + 4 + 16 + 46 + 32
#: Payloads from this size on are CRC'd in a helper thread while they are written.
PARALLEL_CRC_BYTES: Final = 1 << 20
_CLOSED: Final = "closed"
_HALF_WRITTEN: Final = "broken: a record was left half-written (a write or a chunk failed)"


def _crc_beside(view: memoryview, write: Callable[[memoryview], object]) -> int:
    """``write(view)`` while a helper thread computes ``zlib.crc32(view)``; return the CRC.

    zlib releases the GIL on large buffers, so the two overlap when ``write``
    does too (file writes, copies in numpy).  The CRC is waited for even when
    ``write`` raises.
    """
    future = _crc_pool().submit(zlib.crc32, view)
    try:
        write(view)
    finally:
        crc: int = future.result()
    return crc


@functools.cache
def _crc_pool() -> ThreadPoolExecutor:
    """The process's CRC helper threads, started on first use."""
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="ptfile-crc")


def _as_bytes_view(data: Buffer) -> memoryview:
    """A flat unsigned-byte view of a C-contiguous buffer (no copy)."""
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class ZipWriter:
    """Write a ZIP archive the way ``torch.save`` does, record by record.

    Parameters
    ----------
    write : callable
        Called with each piece of output in order (``bytes`` or ``memoryview``);
        it must take all of it (as buffered files do); its return value is
        ignored.  ``file.write`` or ``BytesIO.write`` will do.  If it raises,
        the archive is incomplete and the writer refuses further records.
    prefix : str
        The archive folder; every member is stored as ``prefix/name``.
    alignment : int
        Every member's data starts at a multiple of this (torch's
        ``storage_alignment``, default 64); any value from 1 to
        :data:`MAX_ALIGNMENT`.
    crc32 : bool
        Compute CRC-32s (torch's ``set_crc32_options``); when False every CRC is 0.

    Raises
    ------
    ValueError
        An empty prefix, a prefix containing ``/``, or an alignment out of range.

    Examples
    --------
    >>> import io
    >>> out = io.BytesIO()
    >>> with ZipWriter(out.write, "archive") as writer:
    ...     writer.write_record("version", b"3\\n")
    >>> writer.record_offsets["version"], len(out.getvalue())
    (64, 483)
    """

    def __init__(
        self,
        write: Callable[[bytes | memoryview], object],
        prefix: str,
        *,
        alignment: int = 64,
        crc32: bool = True,
    ) -> None:
        if not prefix or "/" in prefix:
            raise ValueError(f"archive prefix must be non-empty without '/', got {prefix!r}")
        if not 1 <= alignment <= MAX_ALIGNMENT:
            raise ValueError(f"alignment must be in 1..{MAX_ALIGNMENT}, got {alignment}")
        self._write = write
        self._prefix = prefix.encode("utf-8") + b"/"
        self._alignment = alignment
        self._crc32 = crc32
        self._position = 0
        self._offsets: dict[str, int] = {}
        self._central: list[bytes] = []  # central directory entries, one or a run's each
        self._entries = 0
        self._crc_fold = 0  # the CRC half of the serialization id
        self._paddings: dict[int, bytes] = {}
        self._unusable: str | None = None  # why no more records may be written

    @property
    def position(self) -> int:
        """Bytes written so far."""
        return self._position

    @property
    def record_offsets(self) -> Mapping[str, int]:
        """Data offset of every record written so far, by name without prefix."""
        return MappingProxyType(self._offsets)

    def _emit(self, data: bytes | memoryview) -> None:
        """Pass ``data`` (bytes or a flat byte view, so ``len`` counts bytes) to ``write``."""
        self._write(data)
        self._position += len(data)

    def _padding(self, pad: int) -> bytes:
        extra = self._paddings.get(pad)
        if extra is None:
            extra = self._paddings[pad] = padding_extra(pad)
        return extra

    def _ignored(self, name: str) -> bool:
        """True for a caller's ``.data/serialization_id``: like torch, the writer makes its own."""
        return name == SERIALIZATION_ID_NAME and self._unusable is None

    def _begin(self, name: str, size: int) -> tuple[bytes, int]:
        """Write the local header of ``name``; return the full name and the header offset."""
        if self._unusable is not None:
            raise ValueError(f"ZipWriter is {self._unusable}")
        if name in self._offsets or size < 0:
            raise ValueError(f"duplicate record name {name!r}" if size >= 0 else f"size {size} < 0")
        full = self._prefix + name.encode("utf-8")
        if len(full) > U16_MAX:
            raise ValueError(f"record name is {len(full)} bytes long; at most {U16_MAX} fit")
        if size and full.endswith(b"/"):
            raise ValueError(f"record {name!r} ends in '/' (a directory) and cannot hold data")
        offset = self._position
        self._unusable = _HALF_WRITTEN  # until _finish: an exception in between breaks the archive
        zip64 = (
            zip64_extra(offset, size, local=True) if offset >= U32_MAX or size >= U32_MAX else b""
        )
        start = offset + _LOCAL_SIZE + len(full) + len(zip64) + _EXTRA_HEADER_SIZE
        pad = -start % self._alignment
        header = LOCAL_FILE_HEADER_STRUCT.pack(
            LOCAL_FILE_HEADER_SIGNATURE, 0, _FLAGS if size else FLAG_UTF8, METHOD_STORED,
            0, 0, 0, 0, 0, len(full), len(zip64) + _EXTRA_HEADER_SIZE + pad,
        )  # fmt: skip
        self._write(header + full + zip64 + self._padding(pad))
        self._position = start + pad
        if full.startswith(DATA_DESCRIPTOR_SIGNATURE):  # miniz writes the name on its own
            self._crc_fold = fold_write(self._crc_fold, full)
        self._offsets[name] = start + pad
        return full, offset

    def _finish(self, full: bytes, offset: int, size: int, crc: int) -> None:
        """Write the data descriptor and remember the central directory header."""
        zip64 = offset >= U32_MAX or size >= U32_MAX
        if size:
            layout = DESCRIPTOR64_STRUCT if zip64 else DESCRIPTOR_STRUCT
            self._write(layout.pack(DATA_DESCRIPTOR_SIGNATURE, crc, size, size))
            self._position += layout.size
            self._crc_fold = hash_combine(self._crc_fold, crc)  # what fold_write sees in it
        extra = zip64_extra(offset, size) if zip64 else b""
        capped = min(size, U32_MAX)
        header = CENTRAL_DIRECTORY_STRUCT.pack(
            CENTRAL_DIRECTORY_SIGNATURE, 0, 0, _FLAGS if size else FLAG_UTF8, METHOD_STORED,
            0, 0, crc, capped, capped, len(full), len(extra), 0, 0, 0,
            DOS_DIRECTORY_ATTRIBUTE if full.endswith(b"/") else 0, min(offset, U32_MAX),
        )  # fmt: skip
        self._central.append(header + full + extra)
        self._entries += 1
        self._unusable = None

    def write_record(self, name: str, data: Buffer) -> None:
        """Write one record whose bytes are all at hand.

        Parameters
        ----------
        name : str
            Record name without the prefix, e.g. ``"data/0"``.
        data : bytes-like
            The payload (any C-contiguous buffer); passed to ``write`` as is.

        A record named ``.data/serialization_id`` is ignored, as torch ignores
        it (copied archives must not keep another archive's id): :meth:`close`
        writes the id of this one.

        Raises
        ------
        ValueError
            Duplicate name, name too long, a name ending in ``/`` with data, or
            the writer is closed.
        """
        if not self._ignored(name):
            self._write_whole(name, data)

    def _write_whole(self, name: str, data: Buffer) -> None:
        view = _as_bytes_view(data)
        size = view.nbytes
        full, offset = self._begin(name, size)
        if size >= PARALLEL_CRC_BYTES and self._crc32:
            crc = _crc_beside(view, self._emit)
        else:
            crc = zlib.crc32(view) if self._crc32 else 0
            if size:
                self._emit(view)
        if size >= 8 and bytes(view[:4]) == DATA_DESCRIPTOR_SIGNATURE:  # quirk, see module doc
            self._crc_fold = fold_write(self._crc_fold, view[:8])
        self._finish(full, offset, size, crc)

    def write_records(self, records: Iterable[tuple[str, Buffer]]) -> None:
        """Write whole records in turn, as :meth:`write_record` writes one, in few write calls.

        Records with payloads under :data:`BATCH_PAYLOAD_BYTES` are gathered
        into runs of about :data:`BATCH_FLUSH_BYTES`, each laid out by
        :func:`~ptfile.archive._runs.pack_run` and passed to ``write`` as one
        piece; larger payloads are passed as they are.  All is written before
        this returns.

        Raises
        ------
        ValueError
            As :meth:`write_record`; the records before the offending one are
            written and the archive stays usable.
        """
        if self._unusable is not None:
            raise ValueError(f"ZipWriter is {self._unusable}")
        names: list[str] = []
        views: list[memoryview] = []
        budget = 0
        record = _HEAD_BYTES + self._alignment  # what a record adds to a run besides its payload
        try:
            for name, data in records:
                view = data if type(data) is memoryview and data.ndim == 1 and data.format == "B" \
                    else _as_bytes_view(data)
                if view.nbytes >= BATCH_PAYLOAD_BYTES:
                    self._write_run(names, views)
                    self.write_record(name, view)
                    continue
                names.append(name)
                views.append(view)
                budget += view.nbytes + record
                if budget >= BATCH_FLUSH_BYTES:
                    self._write_run(names, views)
                    budget = 0
        except BaseException:
            if self._unusable is None:  # the records before a failing iterator
                self._write_run(names, views)
            raise
        self._write_run(names, views)

    def _write_run(self, names: list[str], views: list[memoryview]) -> None:
        """Write the gathered records (and empty both lists): as one run, or one by one."""
        if not names:
            return
        run_names, run_views = names[:], views[:]
        names.clear()
        views.clear()
        run = pack_run(self._prefix, run_names, run_views, self._position, self._alignment,
                       self._crc32, self._offsets.keys())
        if run is None:
            for name, view in zip(run_names, run_views, strict=True):
                self.write_record(name, view)
            return
        self._unusable = _HALF_WRITTEN  # until write returns
        self._emit(run.local.data)
        self._offsets.update(zip(run_names, run.offsets, strict=True))
        self._central.append(run.central)
        self._entries += len(run_names)
        self._crc_fold = fold_crcs(self._crc_fold, run)
        self._unusable = None

    def write_record_chunks(self, name: str, size: int, chunks: Iterable[Buffer]) -> None:
        """Write one record of ``size`` bytes from ``chunks``, streaming them through.

        The CRC is computed incrementally; nothing is buffered but the first
        8 bytes (for the serialization id).

        Raises
        ------
        ValueError
            The chunks hold more or fewer than ``size`` bytes (the archive is
            then unusable and :meth:`close` refuses to finish it), or as
            :meth:`write_record`.
        """
        if self._ignored(name):
            return
        full, offset = self._begin(name, size)
        crc, total, head = 0, 0, bytearray()
        for chunk in chunks:
            view = _as_bytes_view(chunk)
            total += view.nbytes
            if total > size:
                self._unusable = f"broken: record {name!r} got more than its {size} bytes"
                raise ValueError(self._unusable)
            if self._crc32:
                crc = zlib.crc32(view, crc)
            if len(head) < 8:
                head += view[: 8 - len(head)]
            self._emit(view)
        if total != size:
            self._unusable = f"broken: record {name!r} got {total} of its {size} bytes"
            raise ValueError(self._unusable)
        self._crc_fold = fold_write(self._crc_fold, head)
        self._finish(full, offset, size, crc)

    def write_record_skip_data(self, name: str, size: int) -> None:
        """Write a record of ``size`` zero bytes with CRC 0 (torch's ``skip_data``).

        Raises
        ------
        ValueError
            As :meth:`write_record`.
        """
        if self._ignored(name):
            return
        full, offset = self._begin(name, size)
        for start in range(0, size, ZERO_CHUNK_BYTES):
            self._emit(memoryview(_ZEROS)[: min(ZERO_CHUNK_BYTES, size - start)])
        self._finish(full, offset, size, 0)  # torch passes no buffer: nothing to sniff

    def close(self) -> None:
        """Write ``.data/serialization_id`` and the end records.

        Closing twice does nothing.

        Raises
        ------
        ValueError
            A streamed record was cut short or overlong.
        """
        if self._unusable == _CLOSED:
            return
        if self._unusable is not None:
            raise ValueError(f"ZipWriter is {self._unusable}")
        ident = serialization_id(list(self._offsets), self._crc_fold)
        self._write_whole(SERIALIZATION_ID_NAME, ident.encode("ascii"))
        self._unusable = _CLOSED
        self._write_end()

    def _write_end(self) -> None:
        """Central directory, ZIP64 EOCD, ZIP64 locator and EOCD (always ZIP64, like torch)."""
        cd_offset = self._position
        self._emit(b"".join(self._central))
        cd_size = self._position - cd_offset
        entries = self._entries
        eocd64_offset = self._position
        eocd64 = Zip64EndOfCentralDirectory(
            entries_on_disk=entries, total_entries=entries, cd_size=cd_size, cd_offset=cd_offset
        )
        locator = Zip64Locator(eocd64_offset=eocd64_offset)
        capped = min(entries, U16_MAX)
        eocd = EndOfCentralDirectory(
            entries_on_disk=capped,
            total_entries=capped,
            cd_size=min(cd_size, U32_MAX),
            cd_offset=min(cd_offset, U32_MAX),
        )
        self._emit(eocd64.to_bytes() + locator.to_bytes() + eocd.to_bytes())
        self._central.clear()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Finish the archive unless the block raised (a partial archive stays partial)."""
        if exc_type is None:
            self.close()
