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
  names its files there).  Every item is a complete ``torch.save`` ZIP, read with
  :func:`ptfile.load` under ptfile's default policy: a chunk is a tensor of exactly the
  chunk's sizes and the tensor's dtype (strides as saved), a bytes item any object.
* ``serialization_format=SAFETENSORS``: a tensor's ``offset`` is instead the start of its
  file's one safetensors blob (u64-LE header length, JSON header, data) and ``length`` its
  own byte count; the tensor is the blob's entry named by its FQN, whose dtype, shape,
  ``DCP_SHARDING_INFO`` offsets and byte count must agree with the chunk.
* A tensor is the union of its chunks, each the box ``full[offsets : offsets + sizes]``;
  they must tile the full size exactly (in bounds, no overlap, no gap; zero-size chunks
  allowed).  Tensors come back contiguous, ``requires_grad=False``, as
  ``dcp_to_torch_save`` makes them.

Not read yet: extensions such as zstd (``transform_descriptors``:
:class:`~ptfile.errors.UnsupportedFeatureError`), HuggingFace-writer directories (no
``.metadata``: :class:`~ptfile.errors.FormatError`).
"""

from __future__ import annotations

import io
import itertools
import json
import math
import mmap
import os
import re
from typing import Any, Final

import numpy as np

from .api import load
from .errors import FormatError, PtfileError, UnsupportedFeatureError
from .export.safetensors import CODES
from .formats import policies
from .formats.dcp_metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    ItemKey,
    Metadata,
    StorageInfo,
    TensorStorageMetadata,
    convert,
)
from .limits import DEFAULT_LIMITS, Limits
from .picklevm.unpickler import unpickle
from .tensor import Storage, Tensor

__all__ = ["load_dcp", "read_metadata"]

_RANK_METADATA: Final = re.compile(r"__(\d+)\.metadata")
#: How a torch.save item starts; anything else at a tensor's offset is a safetensors blob.
_ZIP: Final = b"PK\x03\x04"


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


def _read_file(path: str) -> bytes:
    """The bytes of ``path``."""
    data = _map_file(path)
    try:
        return bytes(data)
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def _map_file(path: str) -> bytes | mmap.mmap:
    """``path`` mapped read-only (an empty file is ``b""``, which cannot be mapped)."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except FileNotFoundError as exc:
        raise FormatError(f"DCP checkpoint file {path!r} is missing") from exc
    except OSError as exc:
        raise FormatError(f"DCP checkpoint file {path!r} cannot be read: {exc}") from exc


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


def _load_metadata(directory: str, limits: Limits) -> Metadata:
    path = os.path.join(directory, ".metadata")
    if os.path.isfile(path):
        return read_metadata(_read_file(path), limits)
    ranks = sorted((int(m.group(1)), name) for name in os.listdir(directory)
                   if (m := _RANK_METADATA.fullmatch(name)))
    if not ranks:
        raise FormatError(f"{directory!r} has no .metadata (nor __<rank>.metadata): "
                          "not a torch.distributed.checkpoint directory")
    return _merge([read_metadata(_read_file(os.path.join(directory, name)), limits)
                   for _, name in ranks])


class _Files:
    """The checkpoint's data files, each read once, and the items' bytes in them."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._data: dict[str, bytes | mmap.mmap] = {}
        self._headers: dict[tuple[str, int], tuple[dict[str, Any], int]] = {}

    def __enter__(self) -> _Files:  # noqa: PYI034 (typing.Self is 3.11+)
        return self

    def __exit__(self, *exc: object) -> None:
        for data in self._data.values():
            if isinstance(data, mmap.mmap):
                data.close()

    def file(self, fqn: str, info: StorageInfo) -> bytes | mmap.mmap:
        """The whole file ``info`` names, checked to be one of the directory's."""
        name = info.relative_path
        if not name or "/" in name or "\\" in name or name in (".", ".."):
            raise FormatError(f"item {fqn!r} names the file {name!r}, not one in the directory")
        if info.transforms:
            raise UnsupportedFeatureError(
                f"item {fqn!r} is stored through {list(info.transforms)}: DCP extensions "
                "(zstd) are not read yet")
        data = self._data.get(name)
        if data is None:
            data = self._data[name] = _map_file(os.path.join(self._directory, name))
        return data

    def item(self, fqn: str, info: StorageInfo) -> bytes:
        """The bytes ``[offset, offset + length)`` of the item's file."""
        data = self.file(fqn, info)
        end = info.offset + info.length
        if info.offset < 0 or info.length < 0 or end > len(data):
            raise FormatError(f"item {fqn!r} at [{info.offset}, {end}) lies outside "
                              f"{info.relative_path!r} ({len(data)} bytes)")
        return data[info.offset:end]

    def blob(self, fqn: str, info: StorageInfo) -> tuple[dict[str, Any], int]:
        """The header of the safetensors blob at the item's offset, and where its data starts."""
        key = (info.relative_path, info.offset)
        found = self._headers.get(key)
        if found is None:
            data = self.file(fqn, info)
            start = info.offset + 8
            size = int.from_bytes(data[info.offset:start], "little") if start <= len(data) else -1
            if size < 0 or start + size > len(data):
                raise FormatError(f"the safetensors blob of {fqn!r} at {info.offset} is cut")
            try:
                header = json.loads(data[start:start + size])
                sharding = json.loads(header["__metadata__"]["DCP_SHARDING_INFO"])
                header = {k: {**v, "saved": sharding[k]["saved_offsets"]}
                          for k, v in header.items() if k != "__metadata__"}
            except (ValueError, KeyError, TypeError) as exc:
                raise FormatError(f"the safetensors blob of {fqn!r} has a bad header: "
                                  f"{exc!s:.200}") from exc
            found = self._headers[key] = (header, start + size)
        return found


def _blob_chunk(fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
                info: StorageInfo, files: _Files) -> np.ndarray:
    """A chunk in a SAFETENSORS-format file: its entry, by FQN, in the blob at the offset."""
    header, data_start = files.blob(fqn, info)
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
    data = files.file(fqn, info)
    if not agrees or begin < data_start or end > len(data):
        raise FormatError(f"the safetensors entry of {fqn!r} {entry!r:.160} disagrees with "
                          f"its chunk at {chunk.offsets} of sizes {chunk.sizes}")
    raw = np.dtype(f"V{item.dtype.itemsize}")
    return np.frombuffer(data, raw, nbytes // raw.itemsize, begin).reshape(chunk.sizes)


def _load_item(data: bytes, what: str, limits: Limits) -> Any:
    try:
        return load(io.BytesIO(data), limits=limits)
    except PtfileError as exc:
        if type(exc) is FormatError:
            raise FormatError(f"{what}: {exc}") from exc
        raise


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
           info: StorageInfo, files: _Files, limits: Limits) -> np.ndarray:
    """A chunk's values as raw elements: a torch.save ZIP, or an entry of a safetensors blob."""
    data = files.item(fqn, info)
    if not data.startswith(_ZIP):
        return _blob_chunk(fqn, chunk, item, info, files)
    what = f"chunk {chunk.offsets} of {fqn!r}"
    value = _load_item(data, what, limits)
    if not isinstance(value, Tensor) or value.dtype != item.dtype \
            or tuple(value.shape) != chunk.sizes:
        raise FormatError(f"{what} holds {value!r:.120}, not a {item.dtype} tensor of "
                          f"size {chunk.sizes}")
    raw = np.dtype(f"V{item.dtype.itemsize}")
    return _raw(value, raw) if value.numel() else np.empty(chunk.sizes, raw)


def _tensor(fqn: str, item: TensorStorageMetadata, meta: Metadata, files: _Files,
            limits: Limits) -> Tensor:
    _check_tiling(fqn, item.size, item.chunks)
    infos = [meta.storage_data.get((fqn, chunk.offsets)) for chunk in item.chunks]
    for chunk, info in zip(item.chunks, infos, strict=True):
        # Each chunk's bytes fit in its item: what is allocated is bounded by the files.
        nbytes = math.prod(chunk.sizes) * item.dtype.itemsize
        if info is None or info.length < nbytes:
            raise FormatError(f"the chunk of {fqn!r} at {chunk.offsets} has no storage entry "
                              f"of its {nbytes} bytes")
    raw = np.dtype(f"V{item.dtype.itemsize}")
    full = np.empty(item.size, raw)
    for chunk, info in zip(item.chunks, infos, strict=True):
        assert info is not None  # checked above
        box = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))
        full[box] = _chunk(fqn, chunk, item, info, files, limits)
    storage = Storage(full.reshape(-1).view(np.uint8).data, item.dtype)
    return Tensor(storage, 0, item.size, _contiguous_stride(item.size), dtype=item.dtype)


def _contiguous_stride(size: tuple[int, ...]) -> tuple[int, ...]:
    """torch's contiguous strides: a size-0 dimension counts as 1."""
    stride, step = [], 1
    for dim in reversed(size):
        stride.append(step)
        step *= max(dim, 1)
    return tuple(reversed(stride))


def _child(node: Any, step: str | int, fresh: Any, path: tuple[str | int, ...]) -> Any:
    """``node[step]``, made ``fresh`` where absent (lists padded with None, as torch does)."""
    if isinstance(node, dict) and isinstance(step, str):
        return node.setdefault(step, fresh)
    if isinstance(node, list) and isinstance(step, int) and step >= 0:
        node.extend([None] * (step + 1 - len(node)))
        if node[step] is None:
            node[step] = fresh
        return node[step]
    raise FormatError(f"the planner_data path {path!r:.120} crosses a value")


def _place(root: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    """``root[path[0]][path[1]]... = value``, making dicts and lists on the way."""
    node: Any = root
    for step, following in itertools.pairwise(path):
        node = _child(node, step, {} if isinstance(following, str) else [], path)
    last = path[-1]
    _child(node, last, None, path)
    node[last] = value


def load_dcp(directory: str | os.PathLike[str], *, limits: Limits | None = None) -> Any:
    """The full state dict of a ``torch.distributed.checkpoint`` directory, without torch.

    What ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` writes, as
    :func:`load` would return it: every tensor whole (its chunks placed at their
    offsets, contiguous, ``requires_grad=False``), non-tensor values as saved, the
    nesting rebuilt from the checkpoint's ``planner_data`` (plain dicts and lists,
    int dict keys as strs, in the checkpoint's item order).

    Parameters
    ----------
    directory
        The checkpoint directory: ``.metadata`` (or one ``__<rank>.metadata`` per
        rank, ``use_collectives=False``, all merged) and its ``__<rank>_<n>.distcp``
        files, as ``FileSystemWriter`` writes them (any ``thread_count``, one or
        many files per rank, the TORCH_SAVE or SAFETENSORS serialization format).
    limits
        Ceilings for untrusted input, applied to the metadata and every item.

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
        non-tensor item one outside ptfile's allowlist (:func:`add_safe_globals`).
    UnsupportedFeatureError
        Items stored through an extension (zstd).
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
    path = os.fspath(directory)
    if not os.path.isdir(path):
        raise FormatError(f"{path!r} is not a directory: a DCP checkpoint is one")
    limits = DEFAULT_LIMITS if limits is None else limits
    meta = _load_metadata(path, limits)
    root: dict[str, Any] = {}
    with _Files(path) as files:
        for fqn, item in meta.state_dict_metadata.items():
            path_of = (meta.planner_data or {}).get(fqn, (fqn,))
            _place(root, path_of or (fqn,), _value(fqn, item, meta, files, limits))
    return root


def _value(fqn: str, item: TensorStorageMetadata | BytesStorageMetadata, meta: Metadata,
           files: _Files, limits: Limits) -> Any:
    """The whole tensor, or the object, that ``fqn`` names."""
    if isinstance(item, TensorStorageMetadata):
        return _tensor(fqn, item, meta, files, limits)
    info = meta.storage_data.get((fqn, None))
    if info is None:
        raise FormatError(f"the bytes item {fqn!r} has no storage entry")
    return _load_item(files.item(fqn, info), f"item {fqn!r}", limits)
