"""Lazy, metadata-first access to a checkpoint: :func:`open` and :class:`CheckpointReader`.

``ptfile.open(path)`` is the analogue of ``safetensors.safe_open`` (same method
names) and of torch's ``FakeTensorMode`` metadata load: it reads the ZIP end
records, the central directory, the short metadata records and ``data.pkl``,
and nothing else.  Every tensor's dtype, shape, stride, storage key and the
byte offset of its storage in the file are then known; tensor bytes are read
only when asked for, and then only the bytes of the selection
(:meth:`CheckpointReader.get_slice`).

Offsets come from the central directory with torch's layout rule
(``calculate_storage_offsets``, spec §6), which costs no read.  The rule is
checked once against the first storage's local header; a file laid out
otherwise (re-zipped by another tool) falls back to reading each storage's
local header, a few dozen bytes, on first use.  Data reads always use the
validated local header.

A ``.pt2`` (``torch.export``) is read the same way: its payload configs give
every tensor, its records the bytes on demand.  So is a safetensors file
(:mod:`ptfile.formats.safetensors`): its header gives every tensor and its offset,
the bytes are read on demand, and :meth:`CheckpointReader.metadata` is the file's
``__metadata__``, as ``safe_open`` gives it (``{}`` without one).  Other formats
(legacy pickle stream, tar, TorchScript) are read whole by their reader, as
:func:`ptfile.load` reads them, and offered through the same interface; only their
metadata is then not "free".

:func:`open` decides none of this: it asks :mod:`ptfile.formats` once
(:func:`~ptfile.formats.open_detected`, from the one table of formats that
:func:`ptfile.load` reads through too) and wraps the :class:`~ptfile.formats.options.Opened`
that comes back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import numpy as np

from ._gc import paused_gc
from ._io.local import FileLike, Source, damage_as_format_error
from ._io.paths import is_path
from ._io.remote import StorageOptions, local_path, open_any
from .allowlist.structural import is_module, state_dict
from .archive import Record, ZipReader, computed_data_offset, computed_data_offsets
from .archive.records import METHOD_STORED
from .errors import StorageError, UnsupportedFeatureError
from .formats import Format, ReadOptions, detect_source, open_detected
from .formats.options import Opened, Policy
from .formats.storages import record_bytes
from .formats.zipinfo import ZipInfo
from .limits import DEFAULT_LIMITS, Limits
from .model.dtypes import DType
from .model.selection import runs, select, span
from .model.tensor import Parameter, Storage, Tensor
from .model.tree import flatten

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["CheckpointReader", "TensorInfo", "TensorSlice", "open"]

_INTS: Final = frozenset({int})


class TensorInfo(NamedTuple):
    """What the checkpoint says about one tensor; known without reading its data.

    ``storage_offset``, ``shape`` and ``stride`` count elements; ``data_offset``
    is the file offset of the storage's first byte (None for formats whose
    storages are not records of a ZIP file, and for meta tensors), so the
    tensor's first element lives at ``data_offset + storage_offset * itemsize``.
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    storage_key: str | None
    storage_nbytes: int
    location: str
    data_offset: int | None
    requires_grad: bool
    is_parameter: bool

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's own elements (``numel * itemsize``)."""
        return self.numel * self.dtype.itemsize

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        out = self._asdict()
        out.update(dtype=self.dtype.name, shape=list(self.shape), stride=list(self.stride))
        return out


# --------------------------------------------------------------------------- reading data


_make_info: Final = TensorInfo._make

#: A slice of a file read on demand is read as its contiguous runs when it has at most
#: this many (else as the one span that holds it).  Not a ceiling on input: the caller
#: picks the slice, and either way the same bytes come back (a choice of how to read).
MAX_SLICE_RUNS: Final = 1024


class SliceNames:
    """What a slice read on demand shows besides ``[...]``: the tensor's name, ``shape``
    and ``dtype``, and safetensors' names over them (:class:`TensorSlice`,
    :class:`ptfile.DCPSlice`, :class:`ptfile.zero.ZeroSlice`)."""

    def __init__(self, name: str, shape: tuple[int, ...], dtype: DType) -> None:
        #: The tensor's name in its reader.
        self.name = name
        #: The tensor's (full) shape.
        self.shape = shape
        #: The tensor's dtype (as its reader reads it).
        self.dtype = dtype

    def get_shape(self) -> list[int]:
        """safetensors' name for :attr:`shape`."""
        return list(self.shape)

    def get_dtype(self) -> str:
        """The dtype name (``float32``)."""
        return self.dtype.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self.dtype!r} {list(self.shape)}>"


class TensorSlice(SliceNames):
    """A tensor not yet read: ``[...]`` reads only the bytes the selection needs.

    Mirrors safetensors' slice object (``get_shape``, ``get_dtype``).

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.arange(12, dtype="f4").reshape(3, 4)}, buf)
    >>> with ptfile.open(io.BytesIO(buf.getvalue())) as ck:
    ...     ck.get_slice("w")[1:, ::2].tolist()
    [[4.0, 6.0], [8.0, 10.0]]
    """

    def __init__(self, reader: CheckpointReader, tensor: Tensor, name: str) -> None:
        super().__init__(name, tensor._shape, tensor.dtype)
        self._reader, self._tensor = reader, tensor

    def __getitem__(self, key: object) -> np.ndarray[Any, Any]:
        t = self._tensor
        offset, shape, stride = select(key, t._shape, t._stride, t._offset)
        return self._reader._read_view(t, self.name, offset, shape, stride)


class TensorReader(Mapping[str, Tensor]):
    """What every reader :func:`open` returns shares (:class:`CheckpointReader`,
    :class:`ptfile.DCPReader`, :class:`ptfile.zero.ZeroReader`, the set readers): a
    read-only mapping over the keys of ``_names``, in their order (membership asks them:
    no tensor is read), a context manager that closes it, reads after :meth:`close` that
    raise ``ValueError`` as a closed file's do, and no :attr:`zip_reader` unless the
    tensors are in one archive."""

    format: Format
    #: The tensors' names, in order, as a mapping's keys (the values are the reader's own).
    _names: Mapping[str, object]
    _closed: bool = False

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"I/O operation on a closed {type(self).__name__}")

    @property
    def zip_reader(self) -> ZipReader | None:
        """The archive's validated central directory; None: the tensors are not in one
        archive (a folder, several files, a non-ZIP format)."""
        return None

    def close(self) -> None:
        """Release the files opened so far; arrays already returned stay valid."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class CheckpointReader(TensorReader):
    """A read-only mapping from dotted names to tensors, reading data only on request.

    Use :func:`open` to make one.  ``reader[name]`` and :meth:`get_tensor` read
    the tensor's bytes (zero-copy views of the map when opened with ``mmap``);
    :meth:`info`, :meth:`keys` and :meth:`metadata` read nothing more.
    """

    def __init__(self, source: Source, obj: Any, *, fmt: Format, meta: dict[str, str],
                 zip_reader: ZipReader | None = None, zip_info: ZipInfo | None = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self._source = source
        self._zip, self._zip_info = zip_reader, zip_info
        self.format = fmt
        self._meta = meta
        self._object = obj
        # A whole pickled module (opened structurally) is named as its state_dict().
        self._tensors = state_dict(obj, limits=limits) if is_module(obj) else flatten(obj)
        self._names = self._tensors
        # The storage loaded from each central directory row (None for the others).
        self._by_row: Callable[[], Sequence[Storage | None]] = tuple
        self._computed_ok: bool | None = None
        self._offsets: dict[Storage, int] | None = None

    # -- mapping -----------------------------------------------------------------------
    def __getitem__(self, name: str) -> Tensor:
        """The tensor with its storage's bytes (the whole storage, as torch loads it)."""
        t = self._tensor(name)
        if t.storage is None:
            return t
        s = t.storage
        data = self._storage_bytes(s, 0, s.nbytes, name)
        storage = Storage(data, s.dtype, location=s.location, key=s.key, untyped=s.untyped,
                          byteorder=s.byteorder)
        out = Tensor(storage, t._offset, t._shape, t._stride, dtype=t.dtype,
                     requires_grad=t.requires_grad, metadata=t.metadata)
        if isinstance(t, Parameter):
            out = Parameter(out, t.requires_grad, state=t.state)
        out.python_state, out.type_name = t.python_state, t.type_name  # its Python attributes
        return out

    def _tensor(self, name: str) -> Tensor:
        self._check_open()
        return self._tensors[name]

    # -- safe_open's API ---------------------------------------------------------------
    def get_tensor(self, name: str) -> np.ndarray[Any, Any]:
        """The tensor's values as numpy; a zero-copy read-only view when memory-mapped.

        Raises
        ------
        KeyError
            No tensor has that name.
        UnsupportedFeatureError
            The dtype has no numpy equivalent (complex32, bits*, sub-byte types).
        FormatError
            The storage bytes lie outside the file.
        """
        t = self._tensor(name)
        return self._read_view(t, name, t._offset, t._shape, t._stride)

    def get_slice(self, name: str) -> TensorSlice:
        """A lazy slice: ``reader.get_slice(name)[a:b]`` reads only those bytes.

        Raises
        ------
        KeyError
            No tensor has that name.
        """
        return TensorSlice(self, self._tensor(name), name)

    def metadata(self) -> dict[str, str]:
        """Format, version, byte order, alignment, serialization id... as strings; for a
        safetensors file, its ``__metadata__`` (as ``safe_open``)."""
        return dict(self._meta)

    @property
    def object(self) -> Any:
        """The unpickled object tree; its tensors carry no data (use the mapping for that)."""
        return self._object

    # -- metadata ----------------------------------------------------------------------
    @property
    def zip_reader(self) -> ZipReader | None:
        """The archive's validated central directory (None for non-ZIP formats)."""
        return self._zip

    @property
    def source_size(self) -> int:
        """Size of the input in bytes."""
        return self._source.size

    @property
    def storage_keys(self) -> frozenset[str]:
        """Keys of the storages the pickle references."""
        return frozenset(t.storage.key for t in self._tensors.values()
                         if t.storage is not None and t.storage.key is not None) \
            | frozenset(s.key for s in self._by_row() if s is not None and s.key is not None)

    def load_tensors(self) -> dict[str, Tensor]:
        """Every tensor with its data; tensors sharing a storage in the file share one here."""
        storages: dict[int, Storage] = {}
        out: dict[str, Tensor] = {}
        for name, t in self._tensors.items():
            s = t.storage
            if s is None:
                out[name] = t
                continue
            loaded = storages.get(id(s))
            if loaded is None:
                loaded = storages[id(s)] = Storage(
                    self._storage_bytes(s, 0, s.nbytes, name), s.dtype, location=s.location,
                    key=s.key, untyped=s.untyped, byteorder=s.byteorder)
            view = Tensor(loaded, t._offset, t._shape, t._stride, dtype=t.dtype,
                          requires_grad=t.requires_grad, metadata=t.metadata)
            out[name] = Parameter(view, t.requires_grad) if isinstance(t, Parameter) else view
        return out

    def tensors(self) -> dict[str, Tensor]:
        """The data-less tensors of :attr:`object` by dotted name."""
        return dict(self._tensors)

    def record_data_offset(self, record: Record) -> int:
        """Data offset of any record: computed (torch's layout, no read) or from its header."""
        if self._computed_ok is None and self._zip is not None:
            self._computed_ok = self._zip.data_offset(record) == self.computed_offset(record)
        if self._computed_ok or self._zip is None:
            return self.computed_offset(record)
        return self._zip.data_offset(record)

    def computed_offset(self, record: Record) -> int:
        """Where torch's writer puts the record's data (spec §2.4), computed from the directory."""
        alignment = self._zip_info.storage_alignment if self._zip_info else 64
        return computed_data_offset(record.header_offset, record.name, record.size, alignment)

    def info(self, name: str) -> TensorInfo:
        """dtype, shape, stride, storage key and file offset of one tensor; reads no data.

        Raises
        ------
        KeyError
            No tensor has that name.
        """
        t = self._tensor(name)
        offsets = self._offset_map()
        s = t.storage
        offset = None if s is None else offsets.get(s)
        if s is None or offset is None:
            return self._info(name, t, offsets)
        # The common tensor inline, as infos() does (one frame, no _make: 7 -> 4 µs a key)
        return tuple.__new__(TensorInfo, (name, t.dtype, t._shape, t._stride, t._offset, s.key,
                                          s._nbytes, s.location, offset, t.requires_grad,
                                          isinstance(t, Parameter)))

    def _info(self, name: str, t: Tensor, offsets: dict[Storage, int]) -> TensorInfo:
        s = t.storage
        if s is None:
            return _make_info((name, t.dtype, t._shape, t._stride, t._offset, None, 0, "meta",
                               None, t.requires_grad, isinstance(t, Parameter)))
        offset = offsets.get(s)
        if offset is None:
            offset = self._storage_offset(s)
        return _make_info((name, t.dtype, t._shape, t._stride, t._offset, s.key, s.nbytes,
                           s.location, offset, t.requires_grad, isinstance(t, Parameter)))

    def infos(self) -> Iterator[TensorInfo]:
        """:meth:`info` of every tensor, in key order."""
        self._check_open()
        offsets = self._offset_map()
        get, new, parameter, out = offsets.get, tuple.__new__, Parameter, []
        with paused_gc():  # 10^5 new tuples would trigger ~100 full collections
            # _info inlined for the common tensor (one frame, not three: 70 -> 45 ms on 10^5)
            for name, t in self._tensors.items():
                s = t.storage
                offset = None if s is None else get(s)
                if s is None or offset is None:
                    out.append(self._info(name, t, offsets))
                    continue
                out.append(new(TensorInfo, (name, t.dtype, t._shape, t._stride, t._offset, s.key,
                                            s._nbytes, s.location, offset, t.requires_grad,
                                            isinstance(t, parameter))))
        return iter(out)

    def _offset_map(self) -> dict[Storage, int]:
        """Storage → data offset, computed in one pass when the file has torch's layout.

        Keyed by the storage objects the load made (identity: cheaper to build and to
        look up than 10^5 key strings, which the names would have to be sliced into).
        """
        if self._offsets is not None:
            return self._offsets
        self._offsets = {}
        if self._zip is None or self._zip_info is None:
            return self._offsets
        prefix = f"{self._zip_info.prefix}/data/"
        entries = self._zip.entries
        rows = np.flatnonzero(entries.starting_with(prefix))
        first = self._zip.get(entries.names[rows[0]]) if rows.size else None
        if first is not None and self.record_data_offset(first) == self.computed_offset(first):
            offsets = computed_data_offsets(  # of every row: those without a storage are dropped
                entries.column("header_offset"), entries.name_length, entries.column("size"),
                self._zip_info.storage_alignment)
            by_row = self._by_row()  # empty when no loader told
            self._offsets = {s: offset for s, offset in zip(by_row, offsets.tolist(),
                                                            strict=False) if s is not None}
        return self._offsets

    def _record(self, storage: Storage) -> Record | None:
        if self._zip is None or self._zip_info is None or storage.key is None:
            return None
        return self._zip.get(f"{self._zip_info.prefix}/data/{storage.key}")

    def _storage_offset(self, storage: Storage) -> int | None:
        record = self._record(storage)
        return None if record is None else self.record_data_offset(record)

    def _storage_bytes(self, storage: Storage, start: int, n: int, name: str) -> memoryview:
        if storage.data is not None:
            return storage.data[start:start + n]
        record = self._record(storage)
        if self._zip is None and self._offsets and storage in self._offsets:  # safetensors
            return self._source.view(self._offsets[storage] + start, n, f"tensor {name!r}")
        if record is None or self._zip is None:
            raise StorageError(f"tensor {name!r}: storage {storage.key!r} has no record")
        if record.method != METHOD_STORED:  # inflated whole, as every loader inflates it
            inflated = record_bytes(self._zip, self._source, record, self._zip.data_offset, None)
            return inflated[start:start + n]
        base = self._zip.data_offset(record)
        return self._source.view(base + start, n, f"tensor {name!r}")

    def _read_view(self, t: Tensor, name: str, offset: int, shape: tuple[int, ...],
                   stride: tuple[int, ...]) -> np.ndarray[Any, Any]:
        np_dtype = t.dtype.numpy_dtype()
        if t.storage is None:
            raise UnsupportedFeatureError(f"tensor {name!r} is a meta tensor: it has no data")
        if 0 in shape:
            return np.empty(shape, np_dtype)
        item = t.dtype.itemsize
        if t.storage.data is None and self._source.reads_on_demand:
            picked = self._read_runs(t, name, offset, shape, stride)
            if picked is not None:
                return picked
        low, high = span(offset, shape, stride)
        buffer = self._storage_bytes(t.storage, low * item, (high - low) * item, name)
        array: np.ndarray[Any, Any] = np.ndarray(
            shape, np_dtype, buffer=buffer, offset=(offset - low) * item,
            strides=tuple(s * item for s in stride))
        return t.values_of(array)

    def _read_runs(self, t: Tensor, name: str, offset: int, shape: tuple[int, ...],
                   stride: tuple[int, ...]) -> np.ndarray[Any, Any] | None:
        """A selection read as its contiguous runs only, when the source reads on demand
        and the selection is a fraction of its span; None to read the span instead."""
        found = runs(offset, shape, stride, MAX_SLICE_RUNS)
        low, high = span(offset, shape, stride)
        if found is None or len(found[0]) < 2 or found[1] * len(found[0]) * 2 > high - low:
            return None
        starts, length = found
        item = t.dtype.itemsize
        record = self._record(t.storage) if t.storage is not None else None
        if record is None or record.method != METHOD_STORED or self._zip is None:
            return None
        base = self._zip.data_offset(self._check_span(record, low, high, item, name))
        pieces = self._source.pread_many(
            [(base + int(s) * item, length * item) for s in starts], f"tensor {name!r}")
        flat = np.frombuffer(b"".join(pieces), t.dtype.numpy_dtype())
        return t.values_of(flat.reshape(shape))

    def _check_span(self, record: Record, low: int, high: int, item: int, name: str) -> Record:
        if low < 0 or high * item > record.size:
            raise StorageError(f"tensor {name!r}: elements {low}..{high} reach outside its "
                               f"storage record {record.name!r} ({record.size} bytes)")
        return record

    # -- lifetime ----------------------------------------------------------------------
    def close(self) -> None:
        """Release the file; arrays already returned stay valid."""
        if not self._closed:
            self._closed = True
            self._source.close()

    def __repr__(self) -> str:
        name = self._source.name or "in-memory"
        return f"<ptfile.CheckpointReader {name}: {self.format.value}, {len(self)} tensors>"


# --------------------------------------------------------------------------- open


def _reader_of(opened: Opened, limits: Limits) -> CheckpointReader:
    """A :class:`CheckpointReader` over what a format's opener (or reader) gave back."""
    with paused_gc():  # the flattened names of every tensor: no garbage
        ck = CheckpointReader(opened.source, opened.obj, fmt=opened.format, meta=opened.meta,
                              zip_reader=opened.archive, zip_info=opened.info, limits=limits)
    ck._by_row = opened.by_row
    if opened.offsets is not None:
        ck._offsets = opened.offsets
    return ck


def open(f: FileLike, *, mmap: bool = True, limits: Limits | None = None,
         storage_options: StorageOptions = None, structural: bool = False) -> CheckpointReader:
    """Open a checkpoint for lazy, metadata-first reading (``safetensors.safe_open``'s API).

    Parameters
    ----------
    f
        A path, a seekable binary file object (read from its current position),
        or a URL fsspec knows (``https://``, ``s3://``, ``hf://``…): a ZIP
        checkpoint's metadata then costs a request for its head, one for its
        tail (end records and central directory) and, for a big pickle, one
        for the rest of ``data.pkl``; tensor bytes are fetched when read.
    mmap
        Map a path read-only, so tensors are zero-copy views of the file;
        False reads each selection with positioned reads instead.
    limits
        Ceilings for untrusted input.
    storage_options
        For a URL: fsspec's options for its backend (credentials, endpoints).
    structural
        Resolve globals outside the weights-only allowlist as inert stand-ins
        (:func:`ptfile.load`'s ``structural``; nothing runs): a whole pickled
        ``nn.Module`` then opens, its tensors named as its ``state_dict()``.

    Returns
    -------
    CheckpointReader
        A context manager and read-only ``Mapping[str, Tensor]``.

    Raises
    ------
    FormatError
        The file is not a well-formed checkpoint.
    UnsafeGlobalError
        The pickle names a global outside torch's weights-only allowlist.
    LimitExceededError, UnsupportedFeatureError

    Examples
    --------
    >>> import io, numpy as np, ptfile
    >>> buf = io.BytesIO(); ptfile.save({"w": np.ones((2, 3), "float32")}, buf)
    >>> with ptfile.open(io.BytesIO(buf.getvalue())) as ck:
    ...     list(ck.keys()), ck.info("w").shape, ck.get_tensor("w").sum()
    (['w'], (2, 3), np.float32(6.0))
    """
    limits = limits or DEFAULT_LIMITS
    f = local_path(f)  # type: ignore[assignment]
    source = open_any(f, storage_options=storage_options, mmap=mmap and is_path(f), access="r",
                      lazy=True, limits=limits)
    policy = Policy.STRUCTURAL if structural else Policy.STRICT
    opened: Opened | None = None
    try:
        with damage_as_format_error():
            opened = open_detected(source, detect_source(source, limits),
                                   ReadOptions(limits=limits, policy=policy))
            if opened.source is not source:  # a stream, read whole: the copy is read from
                source.close()
            return _reader_of(opened, limits)
    except BaseException:
        (source if opened is None else opened.source).close()
        raise
