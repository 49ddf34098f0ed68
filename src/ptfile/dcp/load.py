"""Read a ``torch.distributed.checkpoint`` (DCP) directory into one state dict, torch-free.

The format, as torch 2.13's ``FileSystemWriter`` writes it (``../shared/spec/dcp-format.md``):

* ``DIR/.metadata`` is a pickle of torch's ``Metadata`` (:mod:`.formats.dcp_metadata`, read
  with :func:`.formats.policies.dcp`).  With ``use_collectives=False`` there is none: each rank wrote
  ``__{r}.metadata`` listing its own items, and all of them are merged (an item several
  ranks hold is kept once, from the lowest rank).
* ``state_dict_metadata`` maps each flattened FQN to a tensor (dtype, full size, chunks)
  or a bytes item; ``planner_data`` maps it to its object path (str keys, int list
  indices), from which the nesting is rebuilt as torch's ``_EmptyStateDictLoadPlanner``
  does: a ``dict`` where the next component is a str, a ``list`` padded with None where it
  is an int.  Without ``planner_data`` (``flatten_state_dict=False``) the FQN is the key.
* ``storage_data`` maps ``(fqn, chunk offsets)`` (None for bytes items) to
  ``(relative_path, offset, length)``: the item is those bytes of ``DIR/relative_path``
  (any ``__{r}_{n}.distcp``: every writer variant of thread count and files per rank
  names its files there).  Every item is a complete ``torch.save`` ZIP, which MUST end
  exactly at ``offset + length`` with its end of central directory record (torch writes
  no comment; anything else means the length disagrees with the item), read in place as
  :func:`ptfile.load` reads a file (its weights-only policy): a chunk is a tensor of exactly the
  chunk's sizes and the tensor's dtype (strides as saved), a bytes item any object.
* ``serialization_format=SAFETENSORS``: a tensor's ``offset`` is instead the start of its
  file's one safetensors blob (u64-LE header length, JSON header, data) and ``length`` its
  own byte count; the tensor is the blob's entry named by its FQN, whose dtype, shape,
  ``DCP_SHARDING_INFO`` offsets and byte count must agree with the chunk.
* A tensor is the union of its chunks, each the box ``full[offsets : offsets + sizes]``;
  they must tile the full size exactly (in bounds, no overlap, no gap; zero-size chunks
  allowed).  Tensors come back contiguous, ``requires_grad=False``, as
  ``dcp_to_torch_save`` makes them.
* ``_extensions=[ZStandard()]``: an item whose ``transform_descriptors`` is
  ``['stream.zstd/1']`` is one zstd frame (without a content size) of the bytes above, and
  ``offset``/``length`` are its compressed extent.  Descriptors (``name[@domain]/version``,
  major version 1) are listed in reverse order of application, so they are undone in list
  order (:data:`TRANSFORMS`); decompressing needs the ``zstandard`` package
  (ptfile's ``zstd`` extra), and what one item inflates to is bounded.
* HuggingFaceStorageWriter directories have no ``.metadata``: their ``*.safetensors`` files
  are read as torch's ``HuggingFaceStorageReader`` does (:mod:`ptfile.dcp.hf`).

The building blocks, for readers and converters built on this one: :func:`load_metadata`
(the merged :class:`Metadata` of a :class:`~ptfile._io.directory.DirectoryFiles`),
:func:`read_tensor` (one whole tensor by FQN), :func:`read_region` (a box of one, reading
only the chunks that meet it) and :func:`read_value` (any item).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

import numpy as np

from .._io.directory import DirectoryFiles
from .._io.local import BytesSource, damage_as_format_error
from ..allowlist.policy import loads_structurally
from ..archive import ZipReader
from ..errors import FormatError, PtfileError, UnsupportedFeatureError, brief
from ..formats import ReadOptions, policies, read
from ..formats.dcp_metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    ItemKey,
    Metadata,
    StorageInfo,
    TensorStorageMetadata,
    convert,
)
from ..formats.safetensors import CODES, header_json
from ..limits import DEFAULT_LIMITS, Limits
from ..model.tensor import Storage, Tensor
from ..picklevm.unpickler import unpickle

__all__ = [
    "TRANSFORMS",
    "blob_entry",
    "contiguous_stride",
    "load_dcp",
    "load_metadata",
    "object_path",
    "place",
    "read_metadata",
    "read_region",
    "read_tensor",
    "read_value",
    "region_tensor",
    "storage_infos",
    "tensor_item",
]

_RANK_METADATA: Final = re.compile(r"__(\d+)\.metadata")
#: How a torch.save item starts; anything else at a tensor's offset is a safetensors blob.
_ZIP: Final = b"PK\x03\x04"
#: A ZIP's end of central directory record (without a comment) and its size.
_EOCD: Final = b"PK\x05\x06"
_EOCD_BYTES: Final = 22
#: What a torch.save ZIP of one chunk holds beyond the chunk's bytes, at most (records,
#: headers, ``data.pkl`` of up to ``max_ndim`` dims): the bound on what an item inflates to.
_ZIP_OVERHEAD_BYTES: Final = 1 << 20
#: A box: ``(start, stop)`` per dimension.
Box = tuple[tuple[int, int], ...]


def read_metadata(data: bytes, limits: Limits = DEFAULT_LIMITS) -> Metadata:
    """The :class:`~.dcp_metadata.Metadata` in the bytes of a ``.metadata`` file.

    Raises
    ------
    UnsafeGlobalError
        The pickle names a global a DCP ``.metadata`` does not hold.
    FormatError
        The pickle is damaged or not a DCP ``Metadata``.
    """
    root, _ = unpickle(data, find_class=policies.dcp(), persistent_load=None, limits=limits)
    return convert(root)


def _merge(parts: list[Metadata]) -> Metadata:
    """One :class:`Metadata` from every rank's own (``use_collectives=False``)."""
    items: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
    planner: dict[str, tuple[str | int, ...]] = {}
    storage: dict[ItemKey, StorageInfo] = {}
    for part in parts:
        for fqn, item in part.state_dict_metadata.items():
            known = items.get(fqn)
            if known is None or isinstance(known, BytesStorageMetadata):
                items.setdefault(fqn, item)
            elif isinstance(item, TensorStorageMetadata):
                if (item.dtype, item.size) != (known.dtype, known.size):
                    raise FormatError(f"ranks disagree on the dtype or size of {fqn!r}")
                have = {c.offsets for c in known.chunks}
                extra = tuple(c for c in item.chunks if c.offsets not in have)
                items[fqn] = TensorStorageMetadata(known.dtype, known.size,
                                                   known.chunks + extra, known.requires_grad)
        planner.update({k: v for k, v in (part.planner_data or {}).items() if k not in planner})
        storage.update({k: v for k, v in part.storage_data.items() if k not in storage})
    return Metadata(items, planner, storage, parts[0].version if parts else None)


def load_metadata(files: DirectoryFiles, limits: Limits = DEFAULT_LIMITS) -> Metadata:
    """The checkpoint's :class:`Metadata`: ``.metadata``, else every ``__<rank>.metadata``
    merged, else that of a HuggingFace-writer directory's ``*.safetensors``.

    Raises
    ------
    FormatError
        None of these is there, or one is damaged.
    UnsafeGlobalError
        A ``.metadata`` names a global a DCP checkpoint does not hold.
    """
    from .hf import hf_metadata, is_hf_directory

    if files.has(".metadata"):
        return read_metadata(files.read_whole(".metadata", ".metadata"), limits)
    ranks = sorted((int(m.group(1)), name) for name in files.names()
                   if (m := _RANK_METADATA.fullmatch(name)))
    if ranks:
        return _merge([read_metadata(files.read_whole(name, name), limits)
                       for _, name in ranks])
    if is_hf_directory(files):
        return hf_metadata(files, limits)
    raise FormatError(f"{files.directory!r} has no .metadata (nor __<rank>.metadata, nor "
                      "*.safetensors): not a torch.distributed.checkpoint directory")


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


def _blob(files: DirectoryFiles, fqn: str, info: StorageInfo) -> tuple[dict[str, Any], int]:
    """The header of the safetensors blob at the item's offset, and where its data starts
    (cached on ``files``).  Entries without ``DCP_SHARDING_INFO`` were saved at zeros."""
    key = ("safetensors blob", info.relative_path, info.offset)
    found = files.memo.get(key)
    if found is None:
        what = f"the safetensors blob of {fqn!r} at {info.offset}"
        header, start = header_json(  # the one bounded header reader; the directory's limits
            lambda at, n: files.read(info.relative_path, info.offset + at, n, what),
            files.size(info.relative_path) - info.offset, files._limits, what)
        try:
            meta = header.get("__metadata__") or {}
            sharding = json.loads(meta["DCP_SHARDING_INFO"]) if "DCP_SHARDING_INFO" in meta \
                else {}
            header = {k: {**v, "saved": sharding[k]["saved_offsets"] if sharding
                          else [0] * len(v["shape"])}
                      for k, v in header.items() if k != "__metadata__"}
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise FormatError(f"{what} has a bad header: {exc!s:.200}") from exc
        found = files.memo[key] = (header, info.offset + start)
    return found


def blob_entry(fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
               info: StorageInfo, files: DirectoryFiles) -> tuple[int, int]:
    """Where a chunk in a safetensors blob lies, ``(offset in its file, nbytes)``: its
    entry, by FQN, in the blob at the item's offset, checked against the chunk (dtype,
    shape, offsets, length) and the file."""
    header, data_start = _blob(files, fqn, info)
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


def _load_item(data: bytes | memoryview, what: str, limits: Limits, *,
               structural: bool = False) -> Any:
    """A torch.save item, which MUST end with its ZIP's end record (torch writes no
    comment): else the metadata's length disagrees with the item (a ZIP reader would
    accept trailing bytes, or find a later item's end record).  Read as :func:`ptfile.load`
    reads a file: torch's weights-only allowlist and the user's safe globals, or
    ``structural``'s stand-ins."""
    if bytes(data[:4]) == _ZIP and (len(data) < _EOCD_BYTES
                                    or bytes(data[-_EOCD_BYTES:-_EOCD_BYTES + 4]) != _EOCD
                                    or bytes(data[-2:]) != b"\0\0"):
        raise FormatError(f"{what}: its {len(data)} bytes do not end with the item's ZIP end "
                          "record: the length in the metadata disagrees with the item")
    try:
        with damage_as_format_error():  # the bytes are read in place (a view of the map)
            find_class = policies.structural() if structural else policies.strict()
            return read(BytesSource(data), ReadOptions(limits=limits, find_class=find_class))
    except PtfileError as exc:
        if type(exc) is FormatError:
            raise FormatError(f"{what}: {exc}") from exc
        raise


def crc_mismatches(files: DirectoryFiles, fqn: str, info: StorageInfo, most: int, *,
                   limits: Limits = DEFAULT_LIMITS) -> list[str]:
    """The records of a ``torch.save`` item whose bytes disagree with their CRC-32 (records
    saved without one, CRC 0 under ``compute_crc32=False``, are not checked); ``[]`` for an
    entry of a safetensors blob, which has no checksum.

    Raises
    ------
    FormatError, UnsupportedFeatureError
        The item cannot be read (as :func:`load_dcp`).
    """
    if not info.transforms and bytes(files.read(info.relative_path, info.offset,
                                                min(len(_ZIP), info.length), fqn)) != _ZIP:
        return []
    data = item_bytes(files, fqn, info, most)
    with damage_as_format_error():
        reader = ZipReader(BytesSource(data), limits=limits)
        return [r.name for r in reader.records if r.crc32 and not reader.check_crc(r)]


def chunk_bound(chunk: ChunkStorageMetadata, item: TensorStorageMetadata) -> int:
    """The most bytes a chunk's item can inflate to: the chunk and a ZIP's overhead."""
    return math.prod(chunk.sizes) * item.dtype.itemsize + _ZIP_OVERHEAD_BYTES


def _check_tiling(fqn: str, size: tuple[int, ...], chunks: tuple[ChunkStorageMetadata, ...]
                  ) -> None:
    """Chunks in bounds, with no overlap, and covering ``size`` exactly."""
    total = 0
    for chunk in chunks:
        if len(chunk.offsets) != len(size) or len(chunk.sizes) != len(size) or any(
                o + s > d for o, s, d in zip(chunk.offsets, chunk.sizes, size, strict=True)):
            raise FormatError(f"a chunk of {fqn!r} at {chunk.offsets} of sizes {chunk.sizes} "
                              f"does not fit its size {size}")
        total += math.prod(chunk.sizes)
    boxes = [c for c in chunks if all(chunk_size > 0 for chunk_size in c.sizes)]
    if len(boxes) > 1:
        lo = np.array([c.offsets for c in boxes], np.int64)
        hi = lo + np.array([c.sizes for c in boxes], np.int64)
        meets = ((lo[:, None, :] < hi[None, :, :]) & (lo[None, :, :] < hi[:, None, :])).all(-1)
        if (meets & ~np.eye(len(boxes), dtype=bool)).any():
            raise FormatError(f"chunks of {fqn!r} overlap")
    if total != math.prod(size):
        raise FormatError(f"the chunks of {fqn!r} cover {total} of its "
                          f"{math.prod(size)} elements")


def _raw(value: Tensor, raw: np.dtype) -> np.ndarray:
    """The chunk's values as little-endian raw elements (conj/neg bits applied)."""
    if value.dtype.numpy is None:
        return value._raw_view(raw)
    values = value.numpy()
    if values.dtype.byteorder == ">":
        values = values.astype(values.dtype.newbyteorder("<"))
    return values.view(raw)


def _chunk(fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
           info: StorageInfo, files: DirectoryFiles, limits: Limits) -> np.ndarray:
    """A chunk's values as raw elements: a torch.save ZIP, or an entry of a safetensors blob."""
    what = f"chunk {chunk.offsets} of {fqn!r}"
    if not info.transforms and bytes(files.read(info.relative_path, info.offset,
                                                min(len(_ZIP), info.length), what)) != _ZIP:
        return _blob_chunk(fqn, chunk, item, info, files)
    data = item_bytes(files, fqn, info, chunk_bound(chunk, item))
    value = _load_item(data, what, limits)
    if not isinstance(value, Tensor) or value.dtype != item.dtype \
            or tuple(value.shape) != chunk.sizes:
        raise FormatError(f"{what} holds {brief(value, 120)}, not a {item.dtype} tensor of "
                          f"size {chunk.sizes}")
    raw = np.dtype(f"V{item.dtype.itemsize}")
    return _raw(value, raw) if value.numel() else np.empty(chunk.sizes, raw)


def tensor_item(meta: Metadata, fqn: str) -> TensorStorageMetadata:
    item = meta.state_dict_metadata.get(fqn)
    if not isinstance(item, TensorStorageMetadata):
        raise KeyError(fqn)
    return item


def storage_infos(fqn: str, item: TensorStorageMetadata, meta: Metadata) -> list[StorageInfo]:
    """The storage entry of every chunk, after checking that the chunks tile the tensor and
    that each entry can hold its chunk (what is allocated is then bounded by the files)."""
    _check_tiling(fqn, item.size, item.chunks)
    infos = []
    for chunk in item.chunks:
        info = meta.storage_data.get((fqn, chunk.offsets))
        nbytes = math.prod(chunk.sizes) * item.dtype.itemsize
        # A compressed item may be shorter than its chunk (its inflated size is checked).
        if info is None or (info.length < nbytes and not info.transforms):
            raise FormatError(f"the chunk of {fqn!r} at {chunk.offsets} has no storage entry "
                              f"of its {nbytes} bytes")
        infos.append(info)
    return infos


def read_region(meta: Metadata, files: DirectoryFiles, fqn: str, box: Box, *,
                limits: Limits = DEFAULT_LIMITS) -> np.ndarray:
    """The elements ``full[start:stop, ...]`` (one ``(start, stop)`` per dimension) of the
    tensor ``fqn``, as raw ``V<itemsize>`` elements, reading only the chunks that meet the box.

    Raises
    ------
    KeyError
        ``fqn`` is not a tensor of the checkpoint.
    FormatError, UnsupportedFeatureError, LimitExceededError
        As :func:`load_dcp`.
    """
    item = tensor_item(meta, fqn)
    infos = storage_infos(fqn, item, meta)
    if len(box) != len(item.size) or any(
            not 0 <= a <= b <= d for (a, b), d in zip(box, item.size, strict=True)):
        raise IndexError(f"the box {box} does not fit {fqn!r} of size {item.size}")
    raw = np.dtype(f"V{item.dtype.itemsize}")
    out = np.empty(tuple(b - a for a, b in box), raw)
    if out.size == 0:
        return out
    for chunk, info in zip(item.chunks, infos, strict=True):
        low = [max(a, o) for (a, _), o in zip(box, chunk.offsets, strict=True)]
        high = [min(b, o + s) for (_, b), o, s in zip(box, chunk.offsets, chunk.sizes,
                                                       strict=True)]
        if any(lo >= hi for lo, hi in zip(low, high, strict=True)):
            continue
        values = _chunk(fqn, chunk, item, info, files, limits)
        source = tuple(slice(lo - o, hi - o) for lo, hi, o in zip(low, high, chunk.offsets,
                                                                  strict=True))
        target = tuple(slice(lo - a, hi - a) for lo, hi, (a, _) in zip(low, high, box,
                                                                      strict=True))
        out[target] = values[source]
    return out


def read_tensor(meta: Metadata, files: DirectoryFiles, fqn: str, *,
                limits: Limits = DEFAULT_LIMITS) -> Tensor:
    """The whole tensor ``fqn``: its chunks placed at their offsets, contiguous,
    ``requires_grad=False`` (as ``dcp_to_torch_save`` makes it).

    Raises
    ------
    KeyError
        ``fqn`` is not a tensor of the checkpoint.
    FormatError, UnsupportedFeatureError, LimitExceededError
        As :func:`load_dcp`.
    """
    item = tensor_item(meta, fqn)
    full = read_region(meta, files, fqn, tuple((0, d) for d in item.size), limits=limits)
    return region_tensor(full, item)


def region_tensor(values: np.ndarray, item: TensorStorageMetadata) -> Tensor:
    """A contiguous :class:`Tensor` of ``item``'s dtype over raw ``values``."""
    storage = Storage(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data, item.dtype)
    shape = tuple(values.shape)
    return Tensor(storage, 0, shape, contiguous_stride(shape), dtype=item.dtype)


def contiguous_stride(size: tuple[int, ...]) -> tuple[int, ...]:
    """torch's contiguous strides: a size-0 dimension counts as 1."""
    stride, step = [], 1
    for dim in reversed(size):
        stride.append(step)
        step *= max(dim, 1)
    return tuple(reversed(stride))


def read_value(meta: Metadata, files: DirectoryFiles, fqn: str, *,
               limits: Limits = DEFAULT_LIMITS, structural: bool = False) -> Any:
    """The whole tensor, or the object, that ``fqn`` names (a non-tensor item read with
    torch's weights-only allowlist and :func:`ptfile.add_safe_globals`, or with
    ``structural=True`` as :func:`ptfile.load` reads it).

    Raises
    ------
    KeyError
        ``fqn`` is not an item of the checkpoint.
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, LimitExceededError
        As :func:`load_dcp`.
    """
    item = meta.state_dict_metadata[fqn]
    if isinstance(item, TensorStorageMetadata):
        return read_tensor(meta, files, fqn, limits=limits)
    info = meta.storage_data.get((fqn, None))
    if info is None:
        raise FormatError(f"the bytes item {fqn!r} has no storage entry")
    # A copy: the value is the caller's, and must not pin (or view) the mapped file.
    return _load_item(bytes(item_bytes(files, fqn, info, limits.max_pickle_bytes)),
                      f"item {fqn!r}", limits, structural=structural)


def _child(node: Any, step: str | int, fresh: Any, path: tuple[str | int, ...]) -> Any:
    """``node[step]``, made ``fresh`` where absent (lists padded with None, as torch does)."""
    if isinstance(node, dict) and isinstance(step, str):
        return node.setdefault(step, fresh)
    if isinstance(node, list) and isinstance(step, int) and step >= 0:
        node.extend([None] * (step + 1 - len(node)))
        if node[step] is None:
            node[step] = fresh
        return node[step]
    raise FormatError(f"the planner_data path {brief(path, 120)} crosses a value")


def place(root: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    """``root[path[0]][path[1]]... = value``, making dicts and lists on the way
    (``_EmptyStateDictLoadPlanner``'s nesting; lists padded with None)."""
    node: Any = root
    for step, following in itertools.pairwise(path):
        node = _child(node, step, {} if isinstance(following, str) else [], path)
    last = path[-1]
    _child(node, last, None, path)
    node[last] = value


def object_path(meta: Metadata, fqn: str) -> tuple[str | int, ...]:
    """Where ``fqn`` goes in the state dict: its ``planner_data`` path, else ``(fqn,)``."""
    return (meta.planner_data or {}).get(fqn) or (fqn,)


def load_dcp(directory: str | os.PathLike[str], *, weights_only: bool | None = None,
             structural: bool = False, limits: Limits | None = None,
             storage_options: Mapping[str, Any] | None = None) -> Any:
    """The full state dict of a ``torch.distributed.checkpoint`` directory, without torch.

    What ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` writes, as
    :func:`load` would return it: every tensor whole (its chunks placed at their
    offsets, contiguous, ``requires_grad=False``), non-tensor values as saved, the
    nesting rebuilt from the checkpoint's ``planner_data`` (plain dicts and lists,
    int dict keys as strs, in the checkpoint's item order).

    Parameters
    ----------
    directory
        The checkpoint directory, a path or an fsspec URL (``s3://bucket/ckpt``:
        only the items' byte ranges are fetched): ``.metadata`` (or one
        ``__<rank>.metadata`` per rank, ``use_collectives=False``, all merged) and
        its ``__<rank>_<n>.distcp`` files, as ``FileSystemWriter`` writes them (any
        ``thread_count``, one or many files per rank, the TORCH_SAVE or SAFETENSORS
        serialization format, zstd-compressed items); or the ``*.safetensors`` of a
        ``HuggingFaceStorageWriter``.
    weights_only, structural
        How non-tensor items (pickled ``torch.save`` values) are read, as :func:`load`
        reads a file (:mod:`ptfile.allowlist.policy`, torch's environment variables included):
        torch's weights-only allowlist and the user's :func:`safe_globals` (with
        ``ptfile.NUMPY_GLOBALS``, a ``np.random.get_state()`` item loads), or, with
        ``structural=True`` or ``weights_only=False``, unknown globals as inert
        stand-ins.  (torch's own DCP loader unpickles them with ``weights_only=False``.)
        The ``.metadata`` is always read with its own policy, and tensor chunks strictly.
    limits
        Ceilings for untrusted input, applied to the metadata and every item.
    storage_options
        For a URL: fsspec's options for its backend (credentials, endpoints).

    Returns
    -------
    dict
        The state dict.

    Raises
    ------
    FormatError
        The directory is not a DCP checkpoint, or is damaged: a file missing or
        short, chunks that overlap, leave a gap or leave the tensor, an item whose
        bytes are not the tensor or value the metadata says.
    UnsafeGlobalError
        ``.metadata`` names a global a DCP checkpoint does not hold, or a
        non-tensor item one outside ptfile's allowlist (:func:`add_safe_globals`;
        not with ``structural=True``).
    UnsupportedFeatureError
        Items stored through an extension ptfile does not read, or zstd-compressed
        without the ``zstandard`` package (ptfile's ``zstd`` extra).
    RemoteError
        A URL cannot be read.
    LimitExceededError
        A ceiling of ``limits`` was hit.

    Examples
    --------
    >>> import ptfile, tempfile
    >>> with tempfile.TemporaryDirectory() as empty:
    ...     try:
    ...         ptfile.load_dcp(empty)
    ...     except ptfile.FormatError:
    ...         print("not a DCP checkpoint")
    not a DCP checkpoint
    """
    structural = loads_structurally(weights_only, structural)
    limits = DEFAULT_LIMITS if limits is None else limits
    root: dict[str, Any] = {}
    with DirectoryFiles(directory, storage_options=storage_options, limits=limits) as files:
        meta = load_metadata(files, limits)
        for fqn in meta.state_dict_metadata:
            place(root, object_path(meta, fqn),
                  read_value(meta, files, fqn, limits=limits, structural=structural))
    return root


