"""The ``.metadata`` pickle of a ``torch.distributed.checkpoint`` directory, torch-free.

torch writes ``.metadata`` (and, with ``use_collectives=False``, one
``__{rank}.metadata`` per rank) as a plain ``pickle.dump`` of its dataclasses
(``../shared/spec/dcp-format.md`` §2-§3).  ptfile never runs that pickle with
torch's classes: the restricted unpickler resolves exactly these names
(:func:`ptfile.formats.policies.dcp`), and every other global raises
:class:`~ptfile.errors.UnsafeGlobalError`:

=========================================================  ==================================
global                                                     becomes
=========================================================  ==================================
``torch.distributed.checkpoint.metadata.Metadata``,        a :class:`Record` (``NEWOBJ`` then
``TensorStorageMetadata``, ``BytesStorageMetadata``,       at most one ``BUILD``), converted
``ChunkStorageMetadata``, ``TensorProperties``,            after the load into the frozen
``MetadataIndex``, ``StorageMeta``;                        dataclasses below, every field
``torch.distributed.checkpoint.filesystem._StorageInfo``   type-checked
``torch.distributed.checkpoint.metadata                    the int 0, 1 or 2
._MEM_FORMAT_ENCODING`` (called with its value)
``torch.Size`` (called with a tuple of ints)               a tuple of ints
``torch.<dtype>``                                          ptfile's :class:`~ptfile.DType`
``torch.serialization._get_layout`` (``'torch.strided'``)  the str
a ``pathlib`` class of :data:`PATH_CLASSES` (called with   the path as a str
``Path.parts``)
=========================================================  ==================================

The BUILD state is a dict of fields for every class but ``TensorProperties``,
whose state is the 5-tuple ``(dtype, layout, requires_grad, memory_format,
pin_memory)``.  ``MetadataIndex`` of a bytes item has no ``offset`` key;
``_StorageInfo`` has ``transform_descriptors`` only when an extension was used.

Only the path class depends on the Python that wrote the file.  torch keeps
``StorageMeta.checkpoint_id`` as ``Path(checkpoint_id)``, a concrete class, and
pickle names a class by the module that defines it, so the name follows the
writer's platform and CPython (:data:`PATH_CLASSES`):

==============================  ======================  =========================
global                          written by CPython      on
==============================  ======================  =========================
``pathlib.PosixPath``           3.12 and older, 3.14+   POSIX
``pathlib._local.PosixPath``    3.13                    POSIX
``pathlib.WindowsPath``         3.12 and older, 3.14+   Windows
``pathlib._local.WindowsPath``  3.13                    Windows
==============================  ======================  =========================

Every other global, and each item's own pickle, is the same from Python 3.10 to
3.13 (``tests/fixtures/pythons/``).  torch itself reads fewer: CPython before
3.13 has no ``pathlib._local`` and cannot unpickle a 3.13 file's path; CPython
on POSIX cannot make a ``WindowsPath``, nor on Windows a ``PosixPath``.  ptfile
reads all four, as the str of the matching pure path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath, PurePosixPath, PureWindowsPath
from typing import Any, Final

from ..errors import FormatError, brief
from ..model.dtypes import DType

__all__ = [
    "DCP_CLASSES",
    "PATH_CLASSES",
    "BytesStorageMetadata",
    "ChunkStorageMetadata",
    "Metadata",
    "PathClass",
    "Record",
    "StorageInfo",
    "TensorStorageMetadata",
    "built",
    "convert",
    "layout",
    "mem_format",
    "size",
]

_MODULE: Final = "torch.distributed.checkpoint.metadata"


class Record:
    """What ``NEWOBJ`` of a DCP class makes: its torch name and its one ``BUILD`` state."""

    __slots__ = ("state",)
    name: str = ""
    state: Any  # unset until BUILD: NEWOBJ makes records with __new__ only

    def __setstate__(self, state: Any) -> None:
        if built(self) is not None:
            raise FormatError(f"{self.name} is built twice in .metadata")
        self.state = state


def built(record: Record) -> Any:
    """The BUILD state of ``record``; None when it had no BUILD."""
    return getattr(record, "state", None)


#: (module, name) of every DCP class the pickle may create.
DCP_CLASSES: Final = (
    (_MODULE, "Metadata"), (_MODULE, "TensorStorageMetadata"), (_MODULE, "BytesStorageMetadata"),
    (_MODULE, "ChunkStorageMetadata"), (_MODULE, "TensorProperties"), (_MODULE, "MetadataIndex"),
    (_MODULE, "StorageMeta"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
)


def size(dims: Any) -> tuple[int, ...]:
    """``torch.Size(dims)``: a tuple of non-negative ints below 2**62 (torch's are int64)."""
    if not isinstance(dims, (tuple, list)) or not all(
            type(d) is int and 0 <= d < 2**62 for d in dims):
        raise FormatError(f"torch.Size in .metadata takes non-negative ints, not {brief(dims, 80)}")
    return tuple(dims)


def mem_format(value: Any) -> int:
    """``_MEM_FORMAT_ENCODING(value)``: 0 contiguous, 1 channels_last, 2 preserve."""
    if type(value) is not int or value not in (0, 1, 2):
        raise FormatError(f"_MEM_FORMAT_ENCODING has no value {brief(value, 80)}")
    return value


def layout(name: Any) -> str:
    """``torch.serialization._get_layout(name)``: only dense tensors are checkpointed by DCP."""
    if name != "torch.strided":
        raise FormatError(f"DCP tensor layout {brief(name, 80)} is not torch.strided")
    return "torch.strided"


@dataclass(frozen=True, slots=True)
class PathClass:
    """A ``pathlib`` class as a ``.metadata`` pickle names it, which CPythons write that
    name, and the pure path class that joins its ``Path.parts`` the same on every platform.

    Examples
    --------
    >>> PathClass("pathlib._local", "PosixPath", "3.13", PurePosixPath).join("/", "tmp", "ck")
    '/tmp/ck'
    """

    module: str
    name: str
    pythons: str
    pure: type[PurePath]

    def join(self, *parts: Any) -> str:
        """``<module>.<name>(*parts)``, kept as its str (only shown, never opened)."""
        if not all(isinstance(p, str) for p in parts):
            raise FormatError(f"{self.module}.{self.name} in .metadata takes strs")
        return str(self.pure(*parts))


#: Every global a ``StorageMeta.checkpoint_id`` is pickled under (the module docstring's
#: table): CPython 3.13 alone defines the concrete classes in ``pathlib._local``.
PATH_CLASSES: Final = (
    PathClass("pathlib", "PosixPath", "3.12 and older, 3.14+", PurePosixPath),
    PathClass("pathlib._local", "PosixPath", "3.13", PurePosixPath),
    PathClass("pathlib", "WindowsPath", "3.12 and older, 3.14+", PureWindowsPath),
    PathClass("pathlib._local", "WindowsPath", "3.13", PureWindowsPath),
)


@dataclass(frozen=True, slots=True)
class ChunkStorageMetadata:
    """One chunk of a tensor: the box ``[offsets, offsets + sizes)``."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TensorStorageMetadata:
    """A tensor item: its dtype, full (global) size, chunks in plan order, and
    ``requires_grad`` as saved."""

    dtype: DType
    size: tuple[int, ...]
    chunks: tuple[ChunkStorageMetadata, ...]
    requires_grad: bool = False


@dataclass(frozen=True, slots=True)
class BytesStorageMetadata:
    """A non-tensor item: a whole object, torch.save'd."""


@dataclass(frozen=True, slots=True)
class StorageInfo:
    """Where an item's bytes are: ``relative_path[offset:offset + length]``, then undone
    ``transforms`` (e.g. ``('stream.zstd/1',)``, in reverse order of application)."""

    relative_path: str
    offset: int
    length: int
    transforms: tuple[str, ...] = ()


#: The key of a chunk in :attr:`Metadata.storage_data`: ``(fqn, offsets)``, None for bytes.
ItemKey = tuple[str, "tuple[int, ...] | None"]


@dataclass(frozen=True, slots=True)
class Metadata:
    """A DCP ``Metadata``: items in plan order, object paths, and where each item is."""

    state_dict_metadata: dict[str, TensorStorageMetadata | BytesStorageMetadata]
    planner_data: dict[str, tuple[str | int, ...]] | None
    storage_data: dict[ItemKey, StorageInfo]
    version: str | None = None
    checkpoint_id: str | None = None


def _fields(record: Any, cls: str, required: tuple[str, ...]) -> dict[str, Any]:
    """The BUILD dict of a record of class ``cls``, with at least the ``required`` keys."""
    if not isinstance(record, Record) or record.name != cls:
        raise FormatError(f".metadata holds {type(record).__name__} where {cls} belongs")
    state = built(record) or {}
    if not isinstance(state, dict) or any(key not in state for key in required):
        raise FormatError(f"{cls} in .metadata lacks one of the fields {required}")
    return state


def _typed(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise FormatError(f"{what} in .metadata is a {type(value).__name__}")
    return value


def _chunk(record: Any) -> ChunkStorageMetadata:
    state = _fields(record, "ChunkStorageMetadata", ("offsets", "sizes"))
    offsets, sizes = size(state["offsets"]), size(state["sizes"])
    return ChunkStorageMetadata(offsets, sizes)


def _properties(record: Any) -> tuple[DType, bool]:
    if not isinstance(record, Record) or record.name != "TensorProperties":
        raise FormatError("a tensor's properties in .metadata are not TensorProperties")
    state = built(record)
    if isinstance(state, tuple) and len(state) == 5:
        dtype, requires_grad = state[0], state[2]
    elif isinstance(state, dict) and "dtype" in state:
        dtype, requires_grad = state["dtype"], state.get("requires_grad", False)
    else:
        raise FormatError("TensorProperties in .metadata has no dtype")
    return _typed(dtype, DType, "a tensor's dtype"), bool(requires_grad)


def _item(record: Any) -> TensorStorageMetadata | BytesStorageMetadata:
    if isinstance(record, Record) and record.name == "BytesStorageMetadata":
        return BytesStorageMetadata()
    state = _fields(record, "TensorStorageMetadata", ("properties", "size", "chunks"))
    dtype, requires_grad = _properties(state["properties"])
    chunks = tuple(_chunk(c) for c in _typed(state["chunks"], list, "chunks"))
    return TensorStorageMetadata(dtype, size(state["size"]), chunks, requires_grad)


def _index(record: Any) -> ItemKey:
    state = _fields(record, "MetadataIndex", ("fqn",))
    offset = state.get("offset")
    return (_typed(state["fqn"], str, "an fqn"), None if offset is None else size(offset))


def _storage(record: Any) -> StorageInfo:
    state = _fields(record, "_StorageInfo", ("relative_path", "offset", "length"))
    transforms = state.get("transform_descriptors") or []
    return StorageInfo(_typed(state["relative_path"], str, "relative_path"),
                       _typed(state["offset"], int, "an item offset"),
                       _typed(state["length"], int, "an item length"),
                       tuple(_typed(t, str, "a transform") for t in
                             _typed(transforms, list, "transform_descriptors")))


def _path(value: Any) -> tuple[str | int, ...]:
    if not isinstance(value, tuple) or not all(
            isinstance(part, (str, int)) and not isinstance(part, bool) for part in value):
        raise FormatError(f"a planner_data path in .metadata is {brief(value, 80)}")
    return value


def _checkpoint_id(record: Any) -> str | None:
    if record is None:
        return None
    value = _fields(record, "StorageMeta", ()).get("checkpoint_id")
    return value if isinstance(value, str) else None


def _mapping(value: Any, key: Callable[[Any], Any], item: Callable[[Any], Any],
             what: str) -> dict[Any, Any]:
    return {key(k): item(v) for k, v in _typed(value, dict, what).items()}


def convert(root: Any) -> Metadata:
    """The :class:`Metadata` of an unpickled ``.metadata``, every field type-checked.

    Raises
    ------
    FormatError
        The pickle is not a DCP ``Metadata`` of the shapes torch writes.
    """
    state = _fields(root, "Metadata", ("state_dict_metadata", "storage_data"))
    planner = state.get("planner_data")
    fqn: Callable[[Any], str] = lambda k: _typed(k, str, "an fqn")  # noqa: E731
    # Two entries of one (fqn, offset) are one key to torch (MetadataIndex compares and
    # hashes those alone): the dict it unpickles keeps the last entry's value, and so does
    # this one.
    storage = _mapping(state["storage_data"], _index, _storage, "storage_data")
    version = state.get("version")
    return Metadata(
        _mapping(state["state_dict_metadata"], fqn, _item, "state_dict_metadata"),
        None if planner is None else _mapping(planner, fqn, _path, "planner_data"),
        storage, version if isinstance(version, str) else None,
        _checkpoint_id(state.get("storage_meta")))
