"""Reading a ZeRO checkpoint's tensors: assembled from their rank pieces, one at a time.

:class:`Assembler` reads an :class:`~.layout.Entry`'s pieces at their offsets in the rank
files (a local file with ``os.preadv`` straight into the tensor being assembled, a URL
by range requests), never a whole file and never through a map, so the memory a read
holds is the tensor itself.  :class:`ZeroReader` is what :func:`ptfile.open` returns for
a ZeRO folder: :class:`~ptfile.CheckpointReader`'s interface (``keys``, ``info``,
``get_tensor``, ``get_slice``, ``metadata``, ``object``), keyed as DeepSpeed's
consolidated state dict; opening it reads the files' pickles only, and
``get_slice(name)[rows]`` reads only the pieces holding those rows.

Values come in the dtype DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``
returns them (:class:`~.layout.Entry`'s ``dtype``), or, with ``dtype=``, every floating
tensor cast to it as ``zero_to_fp32.py``/``zero_to_torch.py --dtype`` do (round to
nearest even; integer and bool buffers keep theirs).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import numpy as np

from .._io.local import Source
from .._io.paths import is_url
from .._io.remote import open_any
from ..archive import ZipReader
from ..dcp.reader import ChunkInfo
from ..errors import FormatError, PtfileError
from ..formats import Format
from ..limits import DEFAULT_LIMITS, Limits
from ..model.dtypes import DTYPES, DType
from ..model.tensor import Storage, Tensor, contiguous_stride
from ..reader import SliceNames, TensorInfo, TensorReader
from .files import Piece
from .layout import Entry, Layout

__all__ = ["OUTPUT_DTYPES", "Assembler", "ZeroReader", "ZeroSlice", "output_dtype"]

#: The dtypes an output may be cast to (DeepSpeed's ``--dtype`` choices), by their names.
OUTPUT_DTYPES: Final = {"fp32": "float32", "float32": "float32", "fp16": "float16",
                        "float16": "float16", "half": "float16", "bf16": "bfloat16",
                        "bfloat16": "bfloat16"}
#: The most bytes one ``preadv`` asks for (Linux returns at most about 2 GiB).
_MOST: Final = 1 << 30
#: The most bytes :meth:`Assembler.chunks` reads at once.
_SLAB: Final = 16 << 20


def output_dtype(name: str | DType | None) -> DType | None:
    """The output dtype ``name`` asks for (None: each tensor's own).

    Raises
    ------
    ValueError
        Not one of :data:`OUTPUT_DTYPES`.

    Examples
    --------
    >>> output_dtype("bf16"), output_dtype(None)
    (torch.bfloat16, None)
    """
    if name is None or isinstance(name, DType):
        return name
    found = OUTPUT_DTYPES.get(str(name).removeprefix("torch."))
    if found is None:
        raise ValueError(f"unsupported output dtype {name!r}: choose one of "
                         f"{', '.join(sorted(set(OUTPUT_DTYPES)))}")
    return DTYPES[found]


def cast(values: np.ndarray, source: DType, target: DType | None) -> np.ndarray:
    """``values`` (of ``source``) as ``target`` when both are floating (torch's ``.to``)."""
    if target is None or target == source or not source.is_floating_point \
            or not target.is_floating_point:
        return values
    out: np.ndarray = values.astype(target.numpy)
    return out


class Assembler:
    """Reads pieces of the rank files of one tag folder (module docstring)."""

    def __init__(self, layout: Layout, *, storage_options: Mapping[str, Any] | None = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self.layout, self.options, self.limits = layout, storage_options, limits
        self.remote = is_url(layout.folder)
        self._fds: dict[str, int] = {}
        self._sources: dict[str, Source] = {}
        self.bytes_read = 0

    def close(self) -> None:
        """Close every file opened."""
        for fd in self._fds.values():
            os.close(fd)
        for source in self._sources.values():
            source.close()
        self._fds.clear()
        self._sources.clear()

    def _path(self, name: str) -> str:
        folder = self.layout.folder
        return f"{folder.rstrip('/')}/{name}" if self.remote else os.path.join(folder, name)

    def _fill(self, piece: Piece, into: memoryview) -> None:
        """Read ``piece``'s bytes into ``into``."""
        self.bytes_read += len(into)
        if self.remote:
            source = self._sources.get(piece.file)
            if source is None:
                source = self._sources[piece.file] = open_any(
                    self._path(piece.file), storage_options=self.options,
                    limits=self.limits, lazy=True)
            into[:] = source.pread(piece.offset, len(into), f"{piece.file}@{piece.offset}")
            return
        fd = self._fds.get(piece.file)
        if fd is None:
            fd = self._fds[piece.file] = os.open(self._path(piece.file), os.O_RDONLY)
        done = 0
        while done < len(into):
            got = os.preadv(fd, [into[done:done + _MOST]], piece.offset + done)
            if got <= 0:
                raise FormatError(f"{piece.file} ends at {piece.offset + done}, inside a "
                                  "tensor's piece")
            done += got

    def flat(self, entry: Entry, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Elements ``[start, stop)`` of ``entry`` (flat, in its files' dtype)."""
        stop = entry.numel if stop is None else stop
        raw = entry.source
        out = np.empty(max(stop - start, 0), raw.numpy)
        view = out.view(np.uint8).data
        at = 0  # the entry's element where the current piece starts
        for piece in entry.pieces:
            lo, hi = max(start, at), min(stop, at + piece.count)
            if lo < hi:
                part = piece.cut(lo - at, hi - lo)
                size = raw.itemsize
                self._fill(part, view[(lo - start) * size:(hi - start) * size])
                if part.byteorder != sys.byteorder and raw.swap > 1:
                    seg = out[lo - start:hi - start]
                    seg[...] = seg.view(f"u{raw.swap}").byteswap().view(raw.numpy)
            at += piece.count
            if at >= stop:
                break
        return out

    def chunks(self, pieces: tuple[Piece, ...], most: int = _SLAB) -> Iterator[memoryview]:
        """The bytes of ``pieces`` in turn, in chunks of at most ``most`` bytes (one
        buffer per chunk: nothing of the pieces is held after it is consumed)."""
        for piece in pieces:
            size = piece.dtype.itemsize
            step = max(1, most // size)
            for start in range(0, piece.count, step):
                part = piece.cut(start, min(step, piece.count - start))
                out = np.empty(part.count, piece.dtype.numpy)
                self._fill(part, out.view(np.uint8).data)
                if part.byteorder != sys.byteorder and piece.dtype.swap > 1:
                    out = out.view(f"u{piece.dtype.swap}").byteswap().view(piece.dtype.numpy)
                yield out.view(np.uint8).data

    def values(self, entry: Entry, dtype: DType | None = None) -> np.ndarray:
        """The whole tensor of ``entry``, shaped, cast to ``dtype`` (module docstring)."""
        source = self.flat(entry).reshape(entry.shape)
        return cast(source, entry.source, dtype or (entry.dtype if entry.dtype != entry.source
                                                     else None))


def as_tensor(values: np.ndarray, dtype: DType, requires_grad: bool = False) -> Tensor:
    """A contiguous :class:`Tensor` holding ``values``."""
    storage = Storage(np.ascontiguousarray(values).reshape(-1).view(np.uint8).data, dtype)
    shape = tuple(values.shape)
    return Tensor(storage, 0, shape, contiguous_stride(shape), dtype=dtype,
                  requires_grad=requires_grad)


class ZeroSlice(SliceNames):
    """A ZeRO tensor not yet read: ``[...]`` reads only the pieces holding the rows the
    selection meets (its first dimension's range)."""

    def __init__(self, reader: ZeroReader, name: str) -> None:
        entry = reader.layout.entry(name)
        super().__init__(name, entry.shape, reader.dtype_of(entry))
        self._reader, self._entry = reader, entry

    def __getitem__(self, key: object) -> np.ndarray:
        from ..dcp.reader import _bounds  # the DCP slice's reading of a numpy index

        entry, shape = self._entry, self._entry.shape
        box, relative = _bounds(key, shape)
        if not shape:
            return np.asarray(self._reader._values(entry)[relative])
        row = math.prod(shape[1:])
        (first, last), rest = box[0], box[1:]
        flat = self._reader.assembler.flat(entry, first * row, last * row)
        region = cast(flat.reshape((last - first, *shape[1:])), entry.source, self.dtype)
        within: tuple[slice, ...] = (slice(None), *[slice(lo, hi) for lo, hi in rest])
        region = region[within]
        return np.asarray(region[relative])


class ZeroReader(TensorReader):
    """A ZeRO checkpoint's consolidated state dict, each tensor read on request.

    Use :func:`ptfile.open` on the folder to make one.
    """

    format: Format = Format.ZERO

    def __init__(self, layout: Layout, *, dtype: DType | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 limits: Limits | None = None) -> None:
        self.layout, self.dtype = layout, dtype
        self.assembler = Assembler(layout, storage_options=storage_options,
                                   limits=limits or DEFAULT_LIMITS)
        self._names = dict.fromkeys(layout.names())
        self._skeleton: dict[str, Tensor] | None = None

    def dtype_of(self, entry: Entry) -> DType:
        """The dtype ``entry`` is read as."""
        if self.dtype is not None and entry.dtype.is_floating_point:
            return self.dtype
        return entry.dtype

    def _values(self, entry: Entry) -> np.ndarray:
        self._check_open()
        return self.assembler.values(entry, self.dtype)

    # -- mapping -----------------------------------------------------------------------
    def __getitem__(self, name: str) -> Tensor:
        """The whole tensor, assembled from its pieces."""
        entry = self.layout.entry(name)
        return as_tensor(self._values(entry), self.dtype_of(entry), entry.requires_grad)

    # -- safe_open's API ---------------------------------------------------------------
    def get_tensor(self, name: str) -> np.ndarray:
        """The tensor's values as numpy.

        Raises
        ------
        KeyError
            No tensor has that name.
        """
        return self._values(self.layout.entry(name))

    def get_slice(self, name: str) -> ZeroSlice:
        """A lazy slice: ``reader.get_slice(name)[a:b]`` reads only the pieces of rows a..b.

        Raises
        ------
        KeyError
            No tensor has that name.
        """
        return ZeroSlice(self, name)

    def metadata(self) -> dict[str, str]:
        """Stage, world size, tag, DeepSpeed version, counts, as strings."""
        lay = self.layout
        out = {"format": "zero", "stage": str(lay.stage), "world_size": str(lay.world_size),
               "tag": lay.tag, "optimizer": lay.optimizer, "tensors": str(len(lay.entries)),
               "aliases": str(len(lay.aliases)), "groups": str(len(lay.groups)),
               "files": str(len(lay.model_files) + len(lay.optim_files))}
        if lay.ds_version:
            out["ds_version"] = lay.ds_version
        if lay.model_dtype:
            out["model_dtype"] = lay.model_dtype
        return out

    @property
    def object(self) -> dict[str, Tensor]:
        """The state dict, tensors without data (aliases: the same object as their target)."""
        return self.tensors()

    @property
    def source_size(self) -> int:
        """Bytes of the rank files read."""
        return sum(self.layout.sizes.values())

    def tensors(self) -> dict[str, Tensor]:
        """Every tensor by name, without data; tied names share their target's object
        (the same objects as in :attr:`object`)."""
        if self._skeleton is None:
            out: dict[str, Tensor] = {}
            for name, entry in self.layout.entries.items():
                out[name] = Tensor(None, 0, entry.shape, contiguous_stride(entry.shape),
                                   dtype=self.dtype_of(entry), requires_grad=entry.requires_grad)
            for alias, target in self.layout.aliases.items():
                out[alias] = out[target]
            self._skeleton = out
        return dict(self._skeleton)

    def summary(self) -> dict[str, Any]:
        """What :func:`ptfile.inspect` shows of the ZeRO layout: stage, world size, tag,
        optimizer, the training dtype, each flat group (its parameters, elements, and the
        elements each rank saved), the frozen, tied and buffer names, and the files."""
        lay = self.layout
        roles: dict[str, list[str]] = {"buffer": [], "frozen": [], "frozen-bit16": [],
                                       "parameter": []}
        for name, entry in lay.entries.items():
            roles[entry.role].append(name)
        return {"stage": lay.stage, "world_size": lay.world_size, "tag": lay.tag,
                "optimizer": lay.optimizer, "ds_version": lay.ds_version,
                "model_dtype": lay.model_dtype,
                "groups": [{"index": g.index, "params": list(g.params), "numel": g.numel,
                            "rank_numels": list(g.rank_numels)} for g in lay.groups],
                "buffers": roles["buffer"], "frozen": roles["frozen"] + roles["frozen-bit16"],
                "frozen_bit16": roles["frozen-bit16"],
                "excluded_frozen": list(lay.excluded), "tied": dict(lay.aliases),
                "model_files": list(lay.model_files), "optim_files": list(lay.optim_files)}

    def chunks(self, name: str) -> list[ChunkInfo]:
        """The pieces of ``name`` as DCP chunks are described: the first element each
        holds in the flattened tensor (``offsets``), its element count (``sizes``), its
        file, byte offset and length."""
        out, at = [], 0
        for p in self.layout.entry(name).pieces:
            out.append(ChunkInfo((at,), (p.count,), p.file, p.offset,
                                 p.count * p.dtype.itemsize, ()))
            at += p.count
        return out

    def archives(self) -> Iterator[tuple[str, ZipReader]]:
        """Each rank file's ZIP, opened in turn (and closed after), for CRC checks."""
        for name in (*self.layout.model_files, *self.layout.optim_files):
            source = open_any(self.assembler._path(name), storage_options=self.assembler.options,
                              limits=self.assembler.limits, lazy=True)
            try:
                yield name, ZipReader(source, limits=self.assembler.limits)
            finally:
                source.close()

    def info(self, name: str) -> TensorInfo:
        """dtype, shape, (contiguous) stride and byte size of one tensor; reads no data.

        Raises
        ------
        KeyError
            No tensor has that name.
        """
        entry = self.layout.entry(name)
        dtype = self.dtype_of(entry)
        nbytes = entry.numel * dtype.itemsize
        return TensorInfo(name, dtype, entry.shape, contiguous_stride(entry.shape), 0,
                          entry.name, nbytes, "cpu", None, entry.requires_grad,
                          entry.role != "buffer")

    def infos(self) -> Iterator[TensorInfo]:
        """:meth:`info` of every tensor, in key order."""
        return iter([self.info(name) for name in self])

    def pieces(self, name: str) -> tuple[Piece, ...]:
        """Where the elements of ``name`` lie, in order."""
        return self.layout.entry(name).pieces

    def check(self, progress: Callable[[int], None] | None = None
              ) -> Iterator[tuple[str, str, str]]:
        """``(severity, name, message)`` for every tensor that cannot be read: each is
        assembled in turn (``progress`` gets its bytes)."""
        for name, entry in self.layout.entries.items():
            try:
                self.assembler.flat(entry)
            except PtfileError as exc:
                yield "error", name, f"{type(exc).__name__}: {exc}"
            if progress is not None:
                progress(entry.numel * entry.source.itemsize)

    def close(self) -> None:
        """Close the rank files opened so far."""
        self._closed = True
        self.assembler.close()

    def __repr__(self) -> str:
        return f"<ZeroReader {self.layout.folder!r} stage {self.layout.stage} {len(self)} tensors>"
