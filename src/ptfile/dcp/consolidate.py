"""Consolidate a DCP directory into one ``.pt``, one ``.safetensors`` or an HF folder, streaming.

``ptfile convert DIR out.pt | out.safetensors | hf-dir/`` goes tensor by tensor: each
tensor is assembled whole from its chunks, written, and freed before the next, so the
memory held is the largest tensor plus a bounded amount (:data:`SLAB_BYTES` of read
buffer, the writer's buffer, the metadata):

* A chunk stored as a ``torch.save`` ZIP (the TORCH_SAVE format) is located without
  reading its data: its ``data.pkl`` and central directory give the storage record, its
  offset in the file, the chunk's strides (any dense order) and byte order; the elements
  are then read with ``os.preadv`` in pieces of at most :data:`SLAB_BYTES`, straight into
  the tensor being assembled where the piece is contiguous there (a row block), else
  through one reused buffer of that size.  Nothing of the data is mapped: mapped pages
  would count the checkpoint's pages in the process's memory.  A chunk in a SAFETENSORS-format blob is
  read the same way.  Anything else (zstd items, a URL, chunks of other layouts) is read
  whole through :func:`ptfile.dcp.load.read_region`, as is a chunk whose record is
  compressed inside its ZIP.  What an item is, is asked of :func:`ptfile.dcp.items.item_kind`.
* ``.pt``: the object is the state dict :func:`ptfile.load_dcp` returns (bytes items
  loaded, tensors as storages without data), so ``data.pkl`` is pickled from the metadata
  first; then each ``data/<key>`` record is assembled and written in turn
  (:func:`ptfile.formats.zipped.write_zip`'s ``fill``).  The file is byte-identical to
  ``ptfile.save(ptfile.load_dcp(DIR), out)``, hence to ``torch.save`` of what
  ``dcp_to_torch_save`` consolidates (where torch can: §12 of the DCP spec), and loads
  with ``torch.load(weights_only=True)`` when the bytes items hold only what that allows.
* ``.safetensors``: the header is computed from the metadata (every tensor, named by its
  FQN; non-tensor values have no place there and are left out, listed in the summary's
  ``dropped``), with ``{"format": "pt"}`` metadata, by ptfile's one safetensors
  writer (:mod:`ptfile.formats.safetensors.writer`: the order and layout the
  ``safetensors`` package writes), which asks for each tensor in data order.
* a folder: Hugging Face's sharded layout as ``huggingface_hub``'s
  ``save_torch_state_dict`` writes it: tensors in checkpoint order go to shards of at
  most ``shard_bytes`` (default 5 GB, decimal; a larger tensor gets a shard of its own),
  named ``model-00001-of-0000N.safetensors``, plus ``model.safetensors.index.json``
  (``{"metadata": {"total_size": <tensor bytes>}, "weight_map": {fqn: shard}}``, indent
  2).  A single shard is ``model.safetensors`` with no index, as there.

Every output file is written atomically (a temporary file renamed on success).
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from .. import config
from .._io.atomic import atomic_file
from .._io.directory import DirectoryFiles
from .._io.local import FileSource
from ..allowlist.policy import reads_numpy_values
from ..archive import ZipReader
from ..archive.records import METHOD_STORED
from ..errors import FormatError, UnsupportedFeatureError, brief
from ..formats import ReadOptions, read
from ..formats.dcp_metadata import (
    ChunkStorageMetadata,
    Metadata,
    StorageInfo,
    TensorStorageMetadata,
)
from ..formats.inputs import Input
from ..formats.safetensors.meta import ALIASES
from ..formats.safetensors.writer import Layout, Planned, save_file, save_index
from ..formats.zipped import archive_prefix, write_zip
from ..limits import DEFAULT_LIMITS, Limits
from ..model.tensor import Storage, Tensor, contiguous_stride
from .items import ItemKind, blob_entry, item_head, item_kind
from .load import (
    dcp_files,
    load_metadata,
    object_path,
    place,
    read_region,
    read_value,
    storage_infos,
    tensor_item,
    tied_aliases,
)

__all__ = ["SHARD_BYTES", "SLAB_BYTES", "convert_dcp", "write_hf", "write_safetensors"]

#: The most bytes read from a data file at once, into one reused buffer.
SLAB_BYTES: Final = 16 << 20
#: Hugging Face's default largest shard (``max_shard_size="5GB"``, decimal units).
SHARD_BYTES: Final = 5 * 10**9


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True, slots=True)
class _Layout:
    """Where a chunk's elements lie: C order of ``shape`` (the chunk's dimensions in the
    order ``perm``) from byte ``start`` of ``name``, in ``byteorder``."""

    name: str
    start: int
    perm: tuple[int, ...]
    byteorder: str


class _Window(io.RawIOBase):
    """Bytes ``[start, start + length)`` of an open file, as a seekable file of their own."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self._fd, self._start, self._length, self._at = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._at, io.SEEK_END: self._length}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._length - self._at))
        got = os.preadv(self._fd, [view[:n]], self._start + self._at) if n else 0
        self._at += got
        return got


class _Reader:
    """Assembles tensors from a local directory's files with positioned reads."""

    def __init__(self, meta: Metadata, files: DirectoryFiles, limits: Limits,
                 aliases: dict[str, str] | None = None) -> None:
        self.meta, self.files, self.limits = meta, files, limits
        #: Tied names of a safetensors folder (``{alias: kept}``): written as ties again.
        self.aliases = aliases or {}
        self._fds: dict[str, int] = {}
        self._slab = bytearray()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _fd(self, name: str) -> int:
        fd = self._fds.get(name)
        if fd is None:
            self.files.size(name)  # the name is checked to be the directory's own
            fd = self._fds[name] = os.open(os.path.join(self.files.directory, name), os.O_RDONLY)
        return fd

    def _zip_layout(self, fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
                    info: StorageInfo) -> _Layout | None:
        fd = self._fd(info.relative_path)  # skip_data: the item's data.pkl, no storage bytes
        value = read(FileSource(io.BufferedReader(_Window(fd, info.offset, info.length))),
                     ReadOptions(limits=self.limits, skip_data=True))
        if not isinstance(value, Tensor) or value.dtype != item.dtype \
                or tuple(value.shape) != chunk.sizes or value.storage is None:
            raise FormatError(f"chunk {chunk.offsets} of {fqn!r} holds {brief(value, 120)}, not a "
                              f"{item.dtype} tensor of size {chunk.sizes}")
        perm = _dense_order(value.shape, value.stride())
        if perm is None or value.metadata or not value.numel():
            return None
        reader = ZipReader(FileSource(io.BufferedReader(_Window(fd, info.offset, info.length))),
                           limits=self.limits)
        key = value.storage.key
        offset = reader.data_offset(f"{reader.prefix}/data/{key}")
        record = reader.get(f"{reader.prefix}/data/{key}")
        itemsize = item.dtype.itemsize
        if record is None or record.method != METHOD_STORED \
                or (value.storage_offset() + value.numel()) * itemsize > record.size:
            return None  # a compressed record is inflated, the general way
        return _Layout(info.relative_path, info.offset + offset +
                       value.storage_offset() * itemsize, perm, value.storage.byteorder)

    def _layout(self, fqn: str, chunk: ChunkStorageMetadata, item: TensorStorageMetadata,
                info: StorageInfo) -> _Layout | None:
        if info.transforms:
            return None
        what = f"chunk {chunk.offsets} of {fqn!r}"
        head = item_head(self.files, info, what)
        if item_kind(item, info, chunk, head=head, what=what) is ItemKind.TORCH_SAVE:
            return self._zip_layout(fqn, chunk, item, info)
        begin, _ = blob_entry(fqn, chunk, item, info, self.files)
        return _Layout(info.relative_path, begin, tuple(range(len(chunk.sizes))), "little")

    def _copy(self, layout: _Layout, target: np.ndarray, dtype_swap: int) -> None:
        """Fill ``target`` (a view in the order of ``layout.perm``) from the file: pieces that
        are contiguous in ``target`` are read straight into it, others through the slab."""
        fd, at, raw = self._fd(layout.name), layout.start, target.dtype
        swap = layout.byteorder != sys.byteorder and dtype_swap > 1
        for index in _runs(target.shape, raw.itemsize, SLAB_BYTES):
            where = (*index, Ellipsis)  # a view, even of a 0-d target
            piece = target[where]
            nbytes = piece.size * raw.itemsize
            direct = piece.flags.c_contiguous
            if direct:
                view = piece.reshape(-1).view(np.uint8).data
            else:
                if len(self._slab) < nbytes:  # made on first use: most pieces go direct
                    self._slab = bytearray(max(SLAB_BYTES, nbytes))
                view = memoryview(self._slab)[:nbytes]
            got = os.preadv(fd, [view], at)
            if got != nbytes:
                raise FormatError(f"{layout.name!r} ended inside a chunk at {at + got}")
            values = piece.reshape(-1) if direct else np.frombuffer(view, raw, piece.size)
            if swap:
                values = values.view(f"u{dtype_swap}").byteswap().view(raw)
            if swap or not direct:
                piece[...] = values.reshape(piece.shape)
            at += nbytes

    def tensor(self, fqn: str) -> np.ndarray:
        """The whole tensor ``fqn`` as raw ``V<itemsize>`` elements, C-contiguous."""
        item = tensor_item(self.meta, fqn)
        if self.files.is_remote:
            return read_region(self.meta, self.files, fqn, tuple((0, d) for d in item.size),
                               limits=self.limits)
        infos = storage_infos(fqn, item, self.meta)
        full = np.empty(item.size, np.dtype(f"V{item.dtype.itemsize}"))
        for chunk, info in zip(item.chunks, infos, strict=True):
            box: tuple[Any, ...] = tuple(slice(o, o + s) for o, s in zip(
                chunk.offsets, chunk.sizes, strict=True))
            if not math.prod(chunk.sizes):
                continue
            layout = self._layout(fqn, chunk, item, info)
            if layout is None:  # read whole, the general way
                full[box] = read_region(self.meta, self.files, fqn, tuple(
                    (b.start, b.stop) for b in box), limits=self.limits)
            else:
                where = (*box, Ellipsis)  # a view, even of a 0-d tensor
                target = full[where]
                self._copy(layout, target.transpose(layout.perm), item.dtype.swap)
        return full


def _dense_order(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...] | None:
    """The order of dimensions (outermost first) in which ``stride`` lays ``shape`` out
    densely in C order; None when it does not."""
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    expected = 1
    for dim in reversed(order):
        if shape[dim] != 1 and stride[dim] != expected:
            return None
        expected *= shape[dim]
    return tuple(order)


def _runs(shape: tuple[int, ...], itemsize: int, most: int
          ) -> Iterator[tuple[int | slice, ...]]:
    """Index expressions cutting a C-ordered ``shape`` into consecutive pieces of at most
    ``most`` bytes (a whole number of rows of the first dimension that fits, else the same
    one level down)."""
    if not shape:
        yield ()
        return
    row = math.prod(shape[1:]) * itemsize
    if row <= most or len(shape) == 1:
        step = max(1, most // max(row, 1)) if len(shape) > 1 else max(1, most // itemsize)
        for start in range(0, shape[0], step):
            yield (slice(start, min(start + step, shape[0])),)
        return
    for first in range(shape[0]):
        for rest in _runs(shape[1:], itemsize, most):
            yield (first, *rest)


# --------------------------------------------------------------------------- writing


def _placeholder(item: TensorStorageMetadata) -> Tensor:
    nbytes = math.prod(item.size) * item.dtype.itemsize
    storage = Storage(None, item.dtype, nbytes=nbytes)
    return Tensor(storage, 0, item.size, contiguous_stride(item.size), dtype=item.dtype)


def _write_pt(reader: _Reader, dst: str) -> int:
    """The consolidated ``.pt``; return the number of tensors."""
    meta = reader.meta
    root: dict[str, Any] = {}
    fqn_of: dict[int, str] = {}
    for fqn, item in meta.state_dict_metadata.items():
        if isinstance(item, TensorStorageMetadata):
            value: Any = _placeholder(item)
            fqn_of[id(value.storage)] = fqn
        else:
            value = read_value(meta, reader.files, fqn, limits=reader.limits,
                               numpy_values=reads_numpy_values(None))
        place(root, object_path(meta, fqn), value)
    for alias, kept in reader.aliases.items():  # one storage under both names, as torch.save
        root.setdefault(alias, root[kept])

    def fill(storage: Storage) -> Iterator[memoryview]:
        yield reader.tensor(fqn_of[id(storage)]).reshape(-1).view(np.uint8).data

    with atomic_file(dst, fsync=False) as fp:
        write_zip(root, fp.write, archive_prefix(dst), config.current(),
                  byteorder=sys.byteorder, fill=fill)
    return len(fqn_of)


#: The tensor of a name, as raw elements (any dtype of the right itemsize).
TensorOf = Callable[[str], np.ndarray]


def write_safetensors(dst: str, planned: list[Planned], tensor_of: TensorOf,
                      aliases: Mapping[str, str]) -> Layout:
    """One safetensors file of ``planned``, each tensor asked of ``tensor_of`` as the
    writer wants it; ``aliases`` (``{alias: kept}``) of the tensors kept in it are
    recorded under ``ptfile.aliases``."""
    metadata = {"format": "pt"}
    kept = {t.name for t in planned}
    found = {a: k for a, k in sorted(aliases.items()) if k in kept}
    if found:
        metadata[ALIASES] = json.dumps(found, sort_keys=True)
    return save_file(dst, planned, lambda t: tensor_of(t.name), metadata)


def _tensor_fqns(meta: Metadata) -> list[str]:
    return [f for f, i in meta.state_dict_metadata.items() if isinstance(i, TensorStorageMetadata)]


def _planned(meta: Metadata) -> list[Planned]:
    """Every tensor of the DCP metadata, in checkpoint order."""
    out = []
    for fqn in _tensor_fqns(meta):
        item = meta.state_dict_metadata[fqn]
        assert isinstance(item, TensorStorageMetadata)
        out.append(Planned(fqn, item.dtype, tuple(item.size)))
    return out


def _shards(planned: list[Planned], most: int) -> list[list[Planned]]:
    """huggingface_hub's split: in order, a new shard when the next tensor would tip it over
    ``most`` bytes; a tensor larger than that alone in its own."""
    shards: list[list[Planned]] = []
    current: list[Planned] = []
    size = 0
    for tensor in planned:
        nbytes = tensor.nbytes
        if nbytes > most:
            shards.append([tensor])
            continue
        if size + nbytes > most:
            shards.append(current)
            current, size = [], 0
        current.append(tensor)
        size += nbytes
    if current or not shards:
        shards.append(current)
    return shards


def write_hf(out: str, planned: list[Planned], tensor_of: TensorOf, aliases: Mapping[str, str],
             shard_bytes: int) -> tuple[str, int, int]:
    """Hugging Face's sharded folder of ``planned`` (:func:`write_safetensors` per shard,
    ``aliases`` declared in the index too); return the index (or only file), the tensors
    and the shards written."""
    shards = _shards(planned, shard_bytes)
    os.makedirs(out, exist_ok=True)
    if len(shards) == 1:
        target = os.path.join(out, "model.safetensors")
        return target, len(write_safetensors(target, shards[0], tensor_of, aliases).order), 1
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        total += write_safetensors(os.path.join(out, name), shard, tensor_of, aliases).data_size
        weight_map.update(dict.fromkeys((t.name for t in shard), name))
    index = os.path.join(out, "model.safetensors.index.json")
    declared = {ALIASES: dict(sorted(aliases.items()))} if aliases else None
    save_index(index, weight_map, total, declared)
    return index, len(planned), len(shards)


def convert_dcp(src: str | os.PathLike[str] | Input, dst: str | os.PathLike[str], *,
                to: str, shard_bytes: int = SHARD_BYTES,
                limits: Limits | None = None,
                storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Consolidate the DCP checkpoint ``src`` into ``dst``, one tensor at a time.

    Parameters
    ----------
    src
        A DCP directory (any layout :func:`ptfile.load_dcp` reads), or its fsspec URL
        (with ``storage_options``; its tensors are then read chunk by chunk, whole).
    dst
        ``*.pt`` (or ``.pth``/``.bin``/``.ckpt``), ``*.safetensors``, or a folder for
        Hugging Face's sharded safetensors layout.
    to
        ``"pt"``, ``"safetensors"`` or ``"hf"`` (:func:`ptfile.export.convert.target_kind`
        tells which from the names).
    shard_bytes
        The largest shard of a folder output.

    Returns
    -------
    dict
        A summary: output, kind, tensors, shards, aliases, dropped (the non-tensor
        items a ``.safetensors`` output or folder leaves out), changed.

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, LimitExceededError
        As :func:`ptfile.load_dcp`; a dtype safetensors cannot hold.

    Examples
    --------
    >>> import numpy as np, os, ptfile, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> folder = tmp.name
    >>> ptfile.save_dcp({"w": np.ones(3, "float32"), "step": 1}, os.path.join(folder, "ck"))
    >>> convert_dcp(os.path.join(folder, "ck"), os.path.join(folder, "w.pt"), to="pt")["tensors"]
    1
    >>> ptfile.load(os.path.join(folder, "w.pt"))["step"]
    1
    >>> tmp.cleanup()
    """
    target = os.fspath(dst)
    kind = to
    limits = limits or DEFAULT_LIMITS
    with dcp_files(src, storage_options, limits) as files:
        meta = load_metadata(files, limits)
        reader = _Reader(meta, files, limits, tied_aliases(files, limits))
        try:
            if kind == "pt":
                out, count, shards = target, _write_pt(reader, target), 0
            elif kind == "safetensors":
                out, shards = target, 0
                count = len(write_safetensors(target, _planned(meta), reader.tensor,
                                              reader.aliases).order)
            elif kind == "hf":
                out, count, shards = write_hf(target, _planned(meta), reader.tensor,
                                              reader.aliases, shard_bytes)
            else:
                raise UnsupportedFeatureError(f"cannot convert a DCP checkpoint to {kind!r}")
        finally:
            reader.close()
    # Non-tensor items (pickled bytes) have no place among safetensors' tensors.
    tensor_fqns = set(_tensor_fqns(meta))
    dropped = [] if kind == "pt" else [
        {"name": fqn, "type": "DCP bytes item", "reason": "not a tensor: a .safetensors file "
         "holds tensors only"} for fqn in meta.state_dict_metadata if fqn not in tensor_fqns]
    return {"output": out, "kind": kind, "tensors": count, "shards": shards,
            "aliases": dict(reader.aliases), "dropped": dropped, "changed": []}
