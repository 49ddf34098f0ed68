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
only the chunks that meet it) and :func:`read_value` (any item).  What one item's bytes
are, and reading them, is :mod:`ptfile.dcp.items`.
"""

from __future__ import annotations

import itertools
import math
import os
import re
from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from .._io.directory import DirectoryFiles
from ..allowlist.policy import loads_structurally, reads_numpy_values
from ..errors import FormatError, brief
from ..formats import policies
from ..formats.dcp_metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    ItemKey,
    Metadata,
    StorageInfo,
    TensorStorageMetadata,
    convert,
)
from ..formats.inputs import Input, InputKind, folder_kind
from ..limits import DEFAULT_LIMITS, Limits
from ..model.tensor import Storage, Tensor, contiguous_stride
from ..picklevm.unpickler import unpickle
from .items import item_bytes, item_kind, load_item, read_chunk

__all__ = [
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
    "value_info",
]

_RANK_METADATA: Final = re.compile(r"__(\d+)\.metadata")
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


def dcp_files(directory: str | os.PathLike[str] | Input | DirectoryFiles,
              storage_options: Mapping[str, Any] | None = None,
              limits: Limits = DEFAULT_LIMITS) -> DirectoryFiles:
    """The files of a DCP folder: ``directory`` itself when it is its
    :class:`DirectoryFiles`, the listing the input's record carries (nothing is listed
    again), or listed now from a path or URL."""
    if isinstance(directory, DirectoryFiles):
        return directory
    if isinstance(directory, Input):
        return DirectoryFiles(directory.location, storage_options=directory.storage_options,
                              limits=limits, names=directory.names)
    return DirectoryFiles(directory, storage_options=storage_options, limits=limits)


def is_shards(files: DirectoryFiles) -> bool:
    """Whether the folder is a safetensors one (HuggingFace writer, a model folder)."""
    return folder_kind(files.names()) is InputKind.SHARDS


def tied_aliases(files: DirectoryFiles, limits: Limits = DEFAULT_LIMITS) -> dict[str, str]:
    """The tied names the folder's writer left out, ``{alias: kept}``: a safetensors
    folder's (:func:`~ptfile.dcp.hf.hf_aliases`); none for torch's DCP writer, which
    keeps every name."""
    if not is_shards(files):
        return {}
    from .hf import hf_aliases

    return hf_aliases(files, limits)


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
    from .hf import hf_metadata

    if files.has(".metadata"):
        return read_metadata(files.read_whole(".metadata", ".metadata"), limits)
    ranks = sorted((int(m.group(1)), name) for name in files.names()
                   if (m := _RANK_METADATA.fullmatch(name)))
    if ranks:
        return _merge([read_metadata(files.read_whole(name, name), limits)
                       for _, name in ranks])
    if is_shards(files):  # the one decision of input kinds
        return hf_metadata(files, limits)
    raise FormatError(f"{files.directory!r} has no .metadata (nor __<rank>.metadata, nor "
                      "*.safetensors shards alone: its checkpoint files are each one of "
                      "their own): not a torch.distributed.checkpoint directory")


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
        values = read_chunk(fqn, chunk, item, info, files, limits)
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


def read_value(meta: Metadata, files: DirectoryFiles, fqn: str, *,
               limits: Limits = DEFAULT_LIMITS, structural: bool = False,
               numpy_values: bool = False) -> Any:
    """The whole tensor, or the object, that ``fqn`` names (a non-tensor item read with
    torch's weights-only allowlist and :func:`ptfile.add_safe_globals`, or with
    ``structural=True`` as :func:`ptfile.load` reads it; with ``numpy_values``, numpy
    values as data too: :func:`ptfile.allowlist.policy.reads_numpy_values`).

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
    info = value_info(meta, fqn)
    kind = item_kind(item, info)
    # A copy: the value is the caller's, and must not pin (or view) the mapped file.
    return load_item(bytes(item_bytes(files, fqn, info, limits.max_pickle_bytes)),
                     f"item {fqn!r}", limits, kind=kind, structural=structural,
                     numpy_values=numpy_values)


def value_info(meta: Metadata, fqn: str) -> StorageInfo:
    """The storage entry of the bytes item ``fqn``.

    Raises
    ------
    FormatError
        It has none.
    """
    info = meta.storage_data.get((fqn, None))
    if info is None:
        raise FormatError(f"the bytes item {fqn!r} has no storage entry")
    return info


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


def load_dcp(directory: str | os.PathLike[str] | Input, *, weights_only: bool | None = None,
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
        torch's weights-only allowlist and the user's :func:`safe_globals`, or, with
        ``structural=True`` or ``weights_only=False``, unknown globals as inert
        stand-ins; and numpy values (``np.random.get_state()``, numpy scalars) as data,
        with ``ptfile.NUMPY_GLOBALS``'s inert rebuilders, as torch's own DCP loader reads
        them (it unpickles these items with ``weights_only=False``), unless
        ``weights_only=True`` is passed or ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` is set.
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
    numpy_values = reads_numpy_values(weights_only)
    structural = loads_structurally(weights_only, structural)
    limits = DEFAULT_LIMITS if limits is None else limits
    root: dict[str, Any] = {}
    with dcp_files(directory, storage_options, limits) as files:
        meta = load_metadata(files, limits)
        for fqn in meta.state_dict_metadata:
            place(root, object_path(meta, fqn),
                  read_value(meta, files, fqn, limits=limits, structural=structural,
                             numpy_values=numpy_values))
        for alias, kept in tied_aliases(files, limits).items():  # one tensor again
            root.setdefault(alias, root[kept])
    return root


