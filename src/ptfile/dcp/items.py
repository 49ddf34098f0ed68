"""A DCP item: what its bytes are (decided once, :func:`item_kind`), and its readers.

An item is the bytes ``[offset, offset + length)`` of one of the checkpoint's files, as
its ``storage_data`` entry (:class:`~ptfile.formats.dcp_metadata.StorageInfo`) says
(``../shared/spec/dcp-format.md`` §7, §8, §10).  It is one of three kinds
(:class:`ItemKind`), whatever reads it (:func:`ptfile.load_dcp`, :func:`ptfile.open` on a
directory, :func:`ptfile.scan`, the consolidation to one file):

* :attr:`ItemKind.TORCH_SAVE`: a tensor chunk saved by ``torch.save``: a complete ZIP
  that ends exactly at ``offset + length`` with its end of central directory record
  (torch writes no comment).  Its ``length`` is more than the chunk's bytes (a ZIP holds
  ``data.pkl`` and its records besides them).
* :attr:`ItemKind.SAFETENSORS_ENTRY`: a tensor chunk in a safetensors blob (the
  SAFETENSORS serialization format, or a HuggingFaceStorageWriter's file): ``offset`` is
  the blob's start, ``length`` exactly the chunk's bytes, and the chunk is the blob's
  entry named by the FQN, whose header is read by the one safetensors header reader
  (:func:`ptfile.formats.safetensors.header_json`, bounded by
  :attr:`~ptfile.Limits.max_safetensors_header_bytes`).
* :attr:`ItemKind.VALUE`: a non-tensor (bytes) item: ``torch.save`` of the value, read as
  :func:`ptfile.load` reads a file (a ZIP, which then must end at its extent as above, or
  any other form ``torch.load`` reads, such as a legacy pickle stream).

Either ZIP kind may be stored zstd-compressed (``transform_descriptors``:
:data:`TRANSFORMS`): its extent is then the compressed bytes, undone before anything
else; a safetensors entry never is.

The kind is decided from the metadata alone (the item's class, its transforms, its
length against its chunk's bytes), so a reader knows it before reading anything; the
item's first bytes, where a reader reads them, must then agree (a ZIP starts
``PK 03 04``, a safetensors blob with its header's length): where they do not, the
metadata and the item disagree, and every reader raises the same
:class:`~ptfile.FormatError` (:func:`item_kind`'s ``head``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import numpy as np

from .._io.directory import DirectoryFiles
from .._io.local import BytesSource, damage_as_format_error
from ..archive import ZipReader
from ..errors import FormatError, PtfileError, UnsupportedFeatureError, brief
from ..formats import ReadOptions, read
from ..formats.dcp_metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageInfo,
    TensorStorageMetadata,
)
from ..formats.options import Policy
from ..formats.safetensors import CODES, header_json, saved_offsets
from ..limits import DEFAULT_LIMITS, Limits
from ..model.tensor import Tensor

__all__ = [
    "TRANSFORMS",
    "ItemKind",
    "blob_entry",
    "blob_header",
    "chunk_bound",
    "crc_mismatches",
    "item_bytes",
    "item_head",
    "item_kind",
    "load_item",
    "read_chunk",
    "stored_items",
]

#: How a ZIP (a torch.save item) starts.
ZIP_MAGIC: Final = b"PK\x03\x04"
#: A ZIP's end of central directory record (without a comment) and its size.
_EOCD: Final = b"PK\x05\x06"
_EOCD_BYTES: Final = 22
#: What a torch.save ZIP of one chunk holds beyond the chunk's bytes, at most (records,
#: headers, ``data.pkl`` of up to ``max_ndim`` dims): the bound on what an item inflates to.
_ZIP_OVERHEAD_BYTES: Final = 1 << 20


class ItemKind(enum.Enum):
    """What a DCP item's bytes are (see the module's docstring)."""

    #: A tensor chunk as a complete torch.save ZIP spanning the item exactly.
    TORCH_SAVE = "torch.save ZIP"
    #: A tensor chunk as the entry, named by its FQN, of the safetensors blob at the offset.
    SAFETENSORS_ENTRY = "safetensors entry"
    #: A non-tensor value, torch.save'd (read as ptfile.load reads a file).
    VALUE = "value"


def item_kind(item: TensorStorageMetadata | BytesStorageMetadata, info: StorageInfo,
              chunk: ChunkStorageMetadata | None = None, *, head: bytes | None = None,
              what: str = "the item") -> ItemKind:
    """The kind of the item ``info`` locates, of ``item`` (``chunk``: which of its chunks):
    the one decision every DCP reader asks.

    From the metadata: a bytes item is a :attr:`~ItemKind.VALUE`; a tensor chunk stored
    uncompressed in exactly its own bytes is a :attr:`~ItemKind.SAFETENSORS_ENTRY`, any
    other a :attr:`~ItemKind.TORCH_SAVE` ZIP (which always holds more than the chunk).
    ``head``, the item's first bytes as stored (at most 4), must agree where given: a
    torch.save chunk starts ``PK 03 04`` (once inflated, when compressed: checked by
    :func:`load_item`), a safetensors blob does not.

    Raises
    ------
    FormatError
        ``head`` disagrees with the kind the metadata gives.
    """
    if isinstance(item, BytesStorageMetadata):
        return ItemKind.VALUE
    if chunk is None:
        raise TypeError("a tensor item's kind needs its chunk")
    nbytes = math.prod(chunk.sizes) * item.dtype.itemsize
    if info.transforms or info.length != nbytes:
        if head is not None and not info.transforms and head != ZIP_MAGIC[:len(head)]:
            raise FormatError(
                f"{what}: its {info.length} bytes are not the chunk's {nbytes}, so it is a "
                f"torch.save ZIP, but they start with {head.hex(' ') or 'nothing'}, not "
                f"{ZIP_MAGIC.hex(' ')}: the item disagrees with the metadata",
                offset=info.offset, member=info.relative_path)
        return ItemKind.TORCH_SAVE
    if head is not None and len(head) == len(ZIP_MAGIC) and head == ZIP_MAGIC:
        raise FormatError(
            f"{what}: its {info.length} bytes are exactly the chunk's, so it is an entry of "
            "a safetensors blob, but they start a ZIP: the item disagrees with the metadata",
            offset=info.offset, member=info.relative_path)
    return ItemKind.SAFETENSORS_ENTRY


def item_head(files: DirectoryFiles, info: StorageInfo, what: str) -> bytes:
    """The item's first bytes as stored (at most 4), for :func:`item_kind`'s ``head``."""
    return bytes(files.read(info.relative_path, info.offset,
                            min(len(ZIP_MAGIC), info.length), what))


def _unzstd(data: bytes | memoryview, most: int, what: str) -> bytes:
    """One zstd frame (torch writes no content size: streamed), at most ``most`` bytes out."""
    try:
        import zstandard
    except ImportError:
        raise UnsupportedFeatureError(
            f"{what} is zstd-compressed (a DCP ZStandard extension): reading it needs the "
            "zstandard package: pip install zstandard (ptfile's zstd extra)") from None
    try:
        with zstandard.ZstdDecompressor().stream_reader(bytes(data)) as reader:
            out = reader.read(most + 1)
    except zstandard.ZstdError as exc:
        raise FormatError(f"{what}: damaged zstd data: {exc}") from exc
    if len(out) > most:
        raise FormatError(f"{what} inflates to more than the {most} bytes it can hold")
    end = _zstd_frame_end(data, zstandard.frame_header_size(bytes(data[:18])))
    if end != len(data):
        raise FormatError(f"{what}: its zstd frame is {end} bytes, the metadata says "
                          f"{len(data)}: the length disagrees with the item")
    return out


def _zstd_frame_end(data: bytes | memoryview, header: int) -> int:
    """Where the zstd frame starting at 0 ends (RFC 8878 §3.1.1: blocks after the frame
    header, each a 3-byte little-endian header of last flag, type and size; then the
    content checksum when the descriptor's bit 2 is set)."""
    at, last = header, False
    while not last:
        if at + 3 > len(data):
            return -1
        block = int.from_bytes(data[at:at + 3], "little")
        last, kind, size = bool(block & 1), (block >> 1) & 3, block >> 3
        at += 3 + (1 if kind == 1 else size)  # an RLE block holds one byte
    return at + (4 if data[4] & 4 else 0)


#: Undo each DCP extension by its descriptor name (``stream.zstd`` of ``stream.zstd/1``).
TRANSFORMS: Final[Mapping[str, Callable[[bytes | memoryview, int, str], bytes]]] = {
    "stream.zstd": _unzstd,
}


def _undo(data: bytes | memoryview, transforms: tuple[str, ...], most: int,
          what: str) -> bytes | memoryview:
    for descriptor in transforms:  # listed last-applied first
        name, _, version = descriptor.partition("/")
        undo = TRANSFORMS.get(name.partition("@")[0])
        if undo is None or version.partition(".")[0] != "1":
            raise UnsupportedFeatureError(f"{what} is stored through the DCP extension "
                                          f"{descriptor!r}, which ptfile does not read")
        data = undo(data, most, what)
    return data


def item_bytes(files: DirectoryFiles, fqn: str, info: StorageInfo, most: int
                ) -> bytes | memoryview:
    """The item's bytes: ``[offset, offset + length)`` of its file, extensions undone."""
    what = f"item {fqn!r}"
    data = files.read(info.relative_path, info.offset, info.length, what)
    return _undo(data, info.transforms, most, what) if info.transforms else data


def blob_header(files: DirectoryFiles, fqn: str, info: StorageInfo
                ) -> tuple[dict[str, Any], int]:
    """The header of the safetensors blob at the item's offset, and where its data starts
    (cached on ``files``).  Entries without ``DCP_SHARDING_INFO`` were saved at zeros.

    Raises
    ------
    LimitExceededError
        The header is longer than the directory's ``Limits.max_safetensors_header_bytes``.
    FormatError
        The header is damaged.
    """
    key = ("safetensors blob", info.relative_path, info.offset)
    found = files.memo.get(key)
    if found is None:
        what = f"the safetensors blob of {fqn!r} at {info.offset}"
        header, start = header_json(  # the one bounded header reader; the directory's limits
            lambda at, n: files.read(info.relative_path, info.offset + at, n, what),
            files.size(info.relative_path) - info.offset, files._limits, what)
        try:
            saved = saved_offsets(header, what)
            header = {k: {**v, "saved": saved[k]} for k, v in header.items()
                      if k != "__metadata__"}
        except (FormatError, TypeError) as exc:
            raise FormatError(f"{what} has a bad header: {exc!s:.200}") from exc
        found = files.memo[key] = (header, info.offset + start)
    return found


def blob_entry(fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
               info: StorageInfo, files: DirectoryFiles) -> tuple[int, int]:
    """Where a chunk in a safetensors blob lies, ``(offset in its file, nbytes)``: its
    entry, by FQN, in the blob at the item's offset, checked against the chunk (dtype,
    shape, offsets, length) and the file."""
    header, data_start = blob_header(files, fqn, info)
    entry: Any = header.get(fqn)
    nbytes = math.prod(chunk.sizes) * item.dtype.itemsize
    try:
        begin, end = (data_start + int(x) for x in entry["data_offsets"])
        agrees = (CODES.get(entry["dtype"]) == item.dtype.name
                  and tuple(entry["shape"]) == chunk.sizes
                  and tuple(entry["saved"]) == chunk.offsets
                  and end - begin == nbytes == info.length)
    except (TypeError, ValueError, KeyError) as exc:
        raise FormatError(f"the safetensors entry of {fqn!r} is damaged") from exc
    if not agrees or begin < data_start or end > files.size(info.relative_path):
        raise FormatError(f"the safetensors entry of {fqn!r} {brief(entry, 160)} disagrees with "
                          f"its chunk at {chunk.offsets} of sizes {chunk.sizes}")
    return begin, nbytes


def _blob_chunk(fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
                info: StorageInfo, files: DirectoryFiles) -> np.ndarray:
    """A chunk in a safetensors blob, read (see :func:`blob_entry`)."""
    begin, nbytes = blob_entry(fqn, chunk, item, info, files)
    data = files.read(info.relative_path, begin, nbytes, f"the safetensors entry of {fqn!r}")
    raw = np.dtype(f"V{item.dtype.itemsize}")
    return np.frombuffer(data, raw, nbytes // raw.itemsize).reshape(chunk.sizes)


def load_item(data: bytes | memoryview, what: str, limits: Limits, *,
              kind: ItemKind = ItemKind.VALUE, structural: bool = False,
              numpy_values: bool = False) -> Any:
    """A torch.save item's object, from its bytes (transforms undone).  A
    :attr:`~ItemKind.TORCH_SAVE` chunk MUST be a ZIP; a ZIP MUST end with its end record
    (torch writes no comment): else the metadata's length disagrees with the item (a ZIP
    reader would accept trailing bytes, or find a later item's end record).  Read as
    :func:`ptfile.load` reads a file: torch's weights-only allowlist and the user's safe
    globals, or ``structural``'s stand-ins; with ``numpy_values``, numpy values as data
    (:func:`ptfile.formats.policies.numpy_values`) too.

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, LimitExceededError
        As :func:`ptfile.load_dcp`.
    """
    head = bytes(data[:len(ZIP_MAGIC)])
    if kind is ItemKind.TORCH_SAVE and head != ZIP_MAGIC:
        raise FormatError(f"{what}: a torch.save chunk, its bytes start with "
                          f"{head.hex(' ') or 'nothing'}, not a ZIP's {ZIP_MAGIC.hex(' ')}: "
                          "the item disagrees with the metadata")
    if head == ZIP_MAGIC and (len(data) < _EOCD_BYTES
                                    or bytes(data[-_EOCD_BYTES:-_EOCD_BYTES + 4]) != _EOCD
                                    or bytes(data[-2:]) != b"\0\0"):
        raise FormatError(f"{what}: its {len(data)} bytes do not end with the item's ZIP end "
                          "record: the length in the metadata disagrees with the item")
    try:
        with damage_as_format_error():  # the bytes are read in place (a view of the map)
            policy = Policy.of(structural=structural, numpy_values=numpy_values)
            return read(BytesSource(data), ReadOptions(limits=limits, policy=policy))
    except PtfileError as exc:
        if type(exc) is FormatError:
            raise FormatError(f"{what}: {exc}") from exc
        raise


def crc_mismatches(files: DirectoryFiles, fqn: str, info: StorageInfo, most: int, *,
                   kind: ItemKind, limits: Limits = DEFAULT_LIMITS) -> list[str]:
    """The records of a ``torch.save`` item whose bytes disagree with their CRC-32 (records
    saved without one, CRC 0 under ``compute_crc32=False``, are not checked); ``[]`` for an
    entry of a safetensors blob, which has no checksum, and for a value that is no ZIP.
    ``kind``: the item's (:func:`item_kind`).

    Raises
    ------
    FormatError, UnsupportedFeatureError
        The item cannot be read (as :func:`load_dcp`).
    """
    if kind is ItemKind.SAFETENSORS_ENTRY:
        return []
    data = item_bytes(files, fqn, info, most)
    if kind is ItemKind.VALUE and bytes(data[:len(ZIP_MAGIC)]) != ZIP_MAGIC:
        return []
    with damage_as_format_error():
        reader = ZipReader(BytesSource(data), limits=limits)
        return [r.name for r in reader.records if r.crc32 and not reader.check_crc(r)]


def chunk_bound(chunk: ChunkStorageMetadata, item: TensorStorageMetadata) -> int:
    """The most bytes a chunk's item can inflate to: the chunk and a ZIP's overhead."""
    return math.prod(chunk.sizes) * item.dtype.itemsize + _ZIP_OVERHEAD_BYTES


def _raw(value: Tensor, raw: np.dtype) -> np.ndarray:
    """The chunk's values as little-endian raw elements (conj/neg bits applied)."""
    if value.dtype.numpy is None:
        return value._raw_view(raw)
    values = value.numpy()
    if values.dtype.byteorder == ">":
        values = values.astype(values.dtype.newbyteorder("<"))
    return values.view(raw)


def read_chunk(fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
               info: StorageInfo, files: DirectoryFiles, limits: Limits) -> np.ndarray:
    """A chunk's values as raw ``V<itemsize>`` elements, read as its kind says
    (:func:`item_kind`): a torch.save ZIP, or an entry of a safetensors blob.

    Raises
    ------
    FormatError, UnsupportedFeatureError, LimitExceededError
        As :func:`ptfile.load_dcp`.
    """
    what = f"chunk {chunk.offsets} of {fqn!r}"
    head = None if info.transforms else item_head(files, info, what)
    if item_kind(item, info, chunk, head=head, what=what) is ItemKind.SAFETENSORS_ENTRY:
        return _blob_chunk(fqn, chunk, item, info, files)
    data = item_bytes(files, fqn, info, chunk_bound(chunk, item))
    value = load_item(data, what, limits, kind=ItemKind.TORCH_SAVE)
    if not isinstance(value, Tensor) or value.dtype != item.dtype \
            or tuple(value.shape) != chunk.sizes:
        raise FormatError(f"{what} holds {brief(value, 120)}, not a {item.dtype} tensor of "
                          f"size {chunk.sizes}")
    raw = np.dtype(f"V{item.dtype.itemsize}")
    return _raw(value, raw) if value.numel() else np.empty(chunk.sizes, raw)


def stored_items(meta: Metadata) -> Iterator[tuple[str, ItemKind, StorageInfo]]:
    """``(fqn, kind, storage entry)`` of every item the metadata locates, its kind from the
    metadata (:func:`item_kind`, no byte read): every value first (their pickles are what a
    scan must not miss), then every tensor chunk.  Items without a storage entry are left
    out (reading them raises :class:`~ptfile.FormatError`)."""
    tensors = []
    for fqn, item in meta.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            tensors.append((fqn, item))
            continue
        info = meta.storage_data.get((fqn, None))
        if info is not None:
            yield fqn, item_kind(item, info), info
    for fqn, item in tensors:
        for chunk in item.chunks:
            info = meta.storage_data.get((fqn, chunk.offsets))
            if info is not None:
                yield fqn, item_kind(item, info, chunk), info
