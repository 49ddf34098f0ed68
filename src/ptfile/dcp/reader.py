"""Lazy, metadata-first access to a DCP directory: what :func:`ptfile.open` returns for one.

``ptfile.open(dcp_dir)`` reads the checkpoint's metadata (``.metadata``, every
``__<rank>.metadata``, or a HuggingFace-writer directory's safetensors headers) and
nothing else.  :class:`DCPReader` then offers :class:`~ptfile.CheckpointReader`'s
interface (``keys``, ``info``, ``get_tensor``, ``get_slice``, ``metadata``, ``object``,
a context manager and read-only ``Mapping[str, Tensor]``), keyed by the tensors' FQNs:

* a tensor is assembled from its chunks when read (:func:`ptfile.dcp.load.read_region`);
* ``get_slice(fqn)[...]`` takes the selection's bounding box and reads only the chunks
  that meet it: a chunk that does not is never read, and a data file none of whose
  chunks are needed is never opened;
* non-tensor items are :class:`BytesItem` placeholders in :attr:`DCPReader.object`,
  read by :meth:`DCPReader.value`.

A tensor's layout (``stride``) is the contiguous one ``dcp_to_torch_save`` gives it; it
has no single storage in the files, so its ``storage_key`` is its own FQN (the storage it
gets when assembled) and its ``data_offset`` None (:meth:`DCPReader.chunks` says where its
pieces are).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import numpy as np

from .._io.directory import DirectoryFiles
from ..errors import PtfileError
from ..formats import Format
from ..formats.dcp_metadata import (
    ChunkStorageMetadata,
    Metadata,
    StorageInfo,
    TensorStorageMetadata,
)
from ..formats.inputs import Input
from ..limits import DEFAULT_LIMITS, Limits
from ..model.selection import expand
from ..model.tensor import Tensor, contiguous_stride
from ..reader import SliceNames, TensorInfo, TensorReader
from .items import ItemKind, chunk_bound, crc_mismatches, item_kind
from .load import (
    dcp_files,
    is_shards,
    load_metadata,
    object_path,
    place,
    read_region,
    read_tensor,
    read_value,
    region_tensor,
    storage_infos,
    tensor_item,
    tied_aliases,
    value_info,
)

__all__ = ["BytesItem", "ChunkInfo", "DCPReader", "DCPSlice", "open_dcp"]

_BASIC: Final = (int, np.integer, slice, type(Ellipsis), type(None))


@dataclass(frozen=True, slots=True)
class BytesItem:
    """A non-tensor value of the checkpoint, not read yet (:meth:`DCPReader.value` reads it)."""

    fqn: str


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """One chunk of a tensor and where its bytes are (``transforms``: e.g. zstd)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int
    transforms: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {"offsets": list(self.offsets), "sizes": list(self.sizes), "file": self.file,
                "offset": self.offset, "length": self.length,
                "transforms": list(self.transforms)}


def _bounds(key: object, shape: tuple[int, ...]) -> tuple[tuple[tuple[int, int], ...], tuple[Any, ...]]:
    """The bounding box of a basic numpy index on ``shape``, and the index relative to it."""
    keys = key if isinstance(key, tuple) else (key,)
    if not all(isinstance(k, _BASIC) and not isinstance(k, (bool, np.bool_)) for k in keys) \
            or sum(k is Ellipsis for k in keys) > 1:
        raise IndexError("a DCP tensor slice takes ints, slices, '...' and None")
    box: list[tuple[int, int]] = []
    relative: list[Any] = []
    dims = iter(shape)
    for k in expand(keys, len(shape)):
        if k is None:
            relative.append(None)
            continue
        n = next(dims)
        if isinstance(k, (int, np.integer)):
            i = int(k) + n if k < 0 else int(k)
            if not 0 <= i < n:
                raise IndexError(f"index {k} is out of bounds for a dimension of size {n}")
            box.append((i, i + 1))
            relative.append(0)
            continue
        r = range(*cast(slice, k).indices(n))  # only slices are left (checked above)
        if not r:
            box.append((0, 0))
            relative.append(slice(0, 0))
            continue
        low, high = min(r[0], r[-1]), max(r[0], r[-1]) + 1
        box.append((low, high))
        stop = r.stop - low
        relative.append(slice(r.start - low, stop if stop >= 0 else None, r.step))
    return tuple(box), tuple(relative)


class DCPSlice(SliceNames):
    """A DCP tensor not yet read: ``[...]`` reads only the chunks the selection meets."""

    def __init__(self, reader: DCPReader, name: str, item: TensorStorageMetadata) -> None:
        super().__init__(name, item.size, item.dtype)
        self._reader, self._item = reader, item

    def __getitem__(self, key: object) -> np.ndarray[Any, Any]:
        box, relative = _bounds(key, self.shape)
        region = self._reader._region(self.name, box)
        values: np.ndarray[Any, Any] = region_tensor(region, self._item).numpy()
        return np.asarray(values[relative])


class DCPReader(TensorReader):
    """A DCP checkpoint's tensors by FQN, each read from its chunks only on request.

    Use :func:`ptfile.open` on the directory to make one.
    """

    format: Format = Format.DCP

    def __init__(self, files: DirectoryFiles, meta: Metadata, limits: Limits, *,
                 structural: bool = False, numpy_values: bool = False,
                 label: str = "dcp", aliases: Mapping[str, str] | None = None) -> None:
        self.files, self.meta, self._limits = files, meta, limits
        #: What the folder is, in words (metadata's ``format``): ``dcp`` for torch's
        #: FileSystemWriter, ``safetensors shards`` for a safetensors folder.
        self.label = label
        # how non-tensor items are read (read_value)
        self._structural, self._numpy_values = structural, numpy_values
        items = meta.state_dict_metadata
        self._items = {k: v for k, v in items.items() if isinstance(v, TensorStorageMetadata)}
        #: Tied names a safetensors folder's writer left out: ``{alias: kept}``
        #: (:func:`~ptfile.dcp.hf.hf_aliases`), each read as its kept tensor.
        self.aliases = {a: k for a, k in (aliases or {}).items()
                        if k in self._items and a not in items}
        self._items.update({a: self._items[k] for a, k in self.aliases.items()})
        self._names = self._items
        self._skeleton: dict[str, Tensor] | None = None

    # -- mapping -----------------------------------------------------------------------
    def _item(self, name: str) -> TensorStorageMetadata:
        self._check_open()
        return self._items[name]

    def __getitem__(self, name: str) -> Tensor:
        """The whole tensor, assembled from its chunks."""
        self._item(name)
        return read_tensor(self.meta, self.files, self.aliases.get(name, name),
                           limits=self._limits)

    def _region(self, name: str, box: tuple[tuple[int, int], ...]) -> np.ndarray[Any, Any]:
        self._item(name)
        return read_region(self.meta, self.files, self.aliases.get(name, name), box,
                           limits=self._limits)

    # -- safe_open's API ---------------------------------------------------------------
    def get_tensor(self, name: str) -> np.ndarray[Any, Any]:
        """The tensor's values as numpy.

        Raises
        ------
        KeyError
            No tensor has that name.
        FormatError, UnsupportedFeatureError
            As :func:`ptfile.load_dcp`.
        """
        return self[name].numpy()

    def get_slice(self, name: str) -> DCPSlice:
        """A lazy slice: ``reader.get_slice(name)[a:b]`` reads only the chunks it meets.

        Raises
        ------
        KeyError
            No tensor has that name.
        """
        return DCPSlice(self, name, self._item(name))

    def value(self, fqn: str) -> Any:
        """Any item by FQN, read now: a tensor whole, or a non-tensor value.

        Raises
        ------
        KeyError
            No item has that FQN.
        UnsafeGlobalError
            A non-tensor item names a global outside the policy the reader was opened
            with (:func:`ptfile.open`'s ``weights_only``/``structural``, numpy values
            as :func:`ptfile.load_dcp` reads them, and
            :func:`ptfile.safe_globals` in force when this is called).
        """
        self._check_open()
        return read_value(self.meta, self.files, fqn, limits=self._limits,
                          structural=self._structural, numpy_values=self._numpy_values)

    def metadata(self) -> dict[str, str]:
        """Format, DCP version, item and chunk counts, as strings."""
        items = self.meta.state_dict_metadata
        out = {"format": self.label, "items": str(len(items)), "tensors": str(len(self)),
               "chunks": str(sum(len(i.chunks) for i in self._items.values())),
               "files": str(len({i.relative_path for i in self.meta.storage_data.values()}))}
        if self.meta.version is not None:
            out["version"] = self.meta.version
        return out

    @property
    def object(self) -> Any:
        """The state dict's nesting; tensors without data, other values as :class:`BytesItem`."""
        root: dict[str, Any] = {}
        tensors = self.tensors()
        for fqn in self.meta.state_dict_metadata:
            found = tensors.get(fqn)
            place(root, object_path(self.meta, fqn), BytesItem(fqn) if found is None else found)
        return root

    # -- metadata ----------------------------------------------------------------------
    @property
    def source_size(self) -> int:
        """Bytes of the items the metadata lists (no file is opened to say)."""
        return sum(info.length for info in self.meta.storage_data.values())

    def load_tensors(self) -> dict[str, Tensor]:
        """Every tensor assembled now, with its data; an alias (:attr:`aliases`) is its kept
        tensor, one object under both names, as :func:`ptfile.load_dcp` gives them."""
        out = {name: self[name] for name in self._items if name not in self.aliases}
        out.update({alias: out[kept] for alias, kept in self.aliases.items()})
        return {name: out[name] for name in self}

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor by FQN, without data (shape, dtype, contiguous stride); the same
        objects as in :attr:`object`."""
        if self._skeleton is None:
            self._skeleton = {name: Tensor(None, 0, item.size, contiguous_stride(item.size),
                                           dtype=item.dtype) for name, item in self._items.items()
                              if name not in self.aliases}
            self._skeleton.update({a: self._skeleton[k] for a, k in self.aliases.items()})
        return dict(self._skeleton)

    def info(self, name: str) -> TensorInfo:
        """dtype, shape, (contiguous) stride and byte size of one tensor; reads no data.

        Raises
        ------
        KeyError
            No tensor has that name.
        """
        item = self._item(name)
        nbytes = math.prod(item.size) * item.dtype.itemsize
        # Its storage, once assembled, is its own (as load_dcp returns it): keyed by its FQN.
        return TensorInfo(name, item.dtype, item.size, contiguous_stride(item.size), 0,
                          self.aliases.get(name, name), nbytes, "cpu", None,
                          item.requires_grad, False)

    def infos(self) -> Iterator[TensorInfo]:
        """:meth:`info` of every tensor, in key order."""
        return iter([self.info(name) for name in self])

    def chunks(self, name: str) -> list[ChunkInfo]:
        """The chunks of a tensor, in the metadata's order, and where their bytes are.

        Raises
        ------
        KeyError
            No tensor has that name.
        FormatError
            The chunks do not tile the tensor, or one has no storage entry.
        """
        name = self.aliases.get(name, name)
        item = tensor_item(self.meta, name)
        infos = storage_infos(name, item, self.meta)
        return [_chunk_info(c, i.relative_path, i.offset, i.length, i.transforms)
                for c, i in zip(item.chunks, infos, strict=True)]

    def check(self, progress: Callable[[int], None] | None = None
              ) -> Iterator[tuple[str, str, str]]:
        """``(severity, fqn, message)`` for every item that cannot be read as the metadata
        says (errors: chunks that do not tile their tensor, storage entries missing or
        outside their files, items whose bytes are not the chunk or value they should be,
        CRC-32 mismatches).  Every chunk is read, one at a time, and every value
        (``progress`` is called with each item's stored length).
        """
        for fqn, item in self.meta.state_dict_metadata.items():
            try:
                if isinstance(item, TensorStorageMetadata):
                    yield from self._check_chunks(fqn, item, progress)
                    continue
                self.value(fqn)
                info = value_info(self.meta, fqn)
                yield from self._check_crc(fqn, info, item_kind(item, info),
                                           self._limits.max_pickle_bytes)
                if progress is not None:
                    progress(info.length)
            except PtfileError as exc:
                yield "error", fqn, f"{type(exc).__name__}: {exc}"

    def _check_chunks(self, fqn: str, item: TensorStorageMetadata,
                      progress: Callable[[int], None] | None) -> Iterator[tuple[str, str, str]]:
        infos = storage_infos(fqn, item, self.meta)
        for chunk, info in zip(item.chunks, infos, strict=True):
            box = tuple((o, o + n) for o, n in zip(chunk.offsets, chunk.sizes, strict=True))
            read_region(self.meta, self.files, fqn, box, limits=self._limits)
            yield from self._check_crc(fqn, info, item_kind(item, info, chunk),
                                       chunk_bound(chunk, item))
            if progress is not None:
                progress(info.length)

    def _check_crc(self, fqn: str, info: StorageInfo, kind: ItemKind, most: int
                   ) -> Iterator[tuple[str, str, str]]:
        for record in crc_mismatches(self.files, fqn, info, most, kind=kind,
                                     limits=self._limits):
            message = (f"CRC-32 mismatch in {record} of its item at "
                       f"{info.relative_path}@{info.offset}: the bytes were altered")
            yield "error", fqn, message

    def close(self) -> None:
        """Close the data files opened so far."""
        self._closed = True
        self.files.close()

    def __repr__(self) -> str:
        return f"<DCPReader {self.files.directory!r} {len(self)} tensors>"


def _chunk_info(chunk: ChunkStorageMetadata, file: str, offset: int, length: int,
                transforms: tuple[str, ...]) -> ChunkInfo:
    return ChunkInfo(chunk.offsets, chunk.sizes, file, offset, length, transforms)


def open_dcp(directory: str | Input | DirectoryFiles, *, limits: Limits | None = None,
             storage_options: Mapping[str, Any] | None = None,
             structural: bool = False, numpy_values: bool = False,
             label: str | None = None) -> DCPReader:
    """A :class:`DCPReader` on a DCP directory (path or URL, the input's record, or its
    files); reads its metadata only.  ``structural``: non-tensor items are read with
    :func:`ptfile.load`'s structural policy; ``numpy_values``: with numpy values as data
    (:func:`ptfile.load_dcp`).  ``label`` names what the folder is (default: from its
    files).

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, RemoteError
        As :func:`ptfile.load_dcp`.
    """
    limits = limits or DEFAULT_LIMITS
    files = dcp_files(directory, storage_options, limits)
    try:
        if label is None:
            label = "safetensors shards" if is_shards(files) else "dcp"
        meta = load_metadata(files, limits)
        return DCPReader(files, meta, limits, structural=structural, numpy_values=numpy_values,
                         label=label, aliases=tied_aliases(files, limits))
    except BaseException:
        files.close()
        raise
