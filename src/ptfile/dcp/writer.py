"""Write a ``torch.distributed.checkpoint`` (DCP) directory without torch: :func:`save_dcp`.

The layout is what torch 2.13's ``dcp.save(state_dict, checkpoint_id=DIR)`` writes from one
process with the default ``FileSystemWriter`` and ``DefaultSavePlanner``
(``../shared/spec/dcp-format.md`` §1-§8):

* ``DIR/__0_0.distcp``: every item back to back from byte 0, no header, no padding: first
  the non-tensor (bytes) items, then the tensors, each group in the flattened state dict's
  order.  Every item is a complete ``torch.save`` ZIP (archive folder ``archive``), written
  by :func:`ptfile.formats.zipped.write_zip`, so it is byte-identical to torch's item of the
  same value:

  - a tensor item holds the tensor itself (strides as given, ``requires_grad=False``) when
    its storage is exactly its ``numel * itemsize`` bytes from offset 0; otherwise a copy
    of just its elements (what torch's ``clone()`` does there: a dense permutation keeps
    its strides, anything else becomes C-contiguous, where torch's ``clone()`` would order
    it like the source's strides);
  - a bytes item is ``torch.save(value)`` of the value (what ``DefaultSavePlanner``
    pickles, loaded by torch with ``weights_only=False``).

* ``DIR/.metadata``: torch's ``Metadata`` dataclass, pickled with protocol 4 (CPython's
  default, which torch uses) by ptfile's own pickler, every class named by its global
  (``NEWOBJ`` + ``BUILD``, §2-§3): ``state_dict_metadata`` (one ``TensorStorageMetadata``
  with a single chunk at zero offsets per tensor, ``BytesStorageMetadata`` per value),
  ``planner_data`` (FQN → object path), ``storage_data`` (``MetadataIndex`` →
  ``_StorageInfo``: file, offset, length), ``storage_meta`` (``StorageMeta`` with the
  directory as given as ``checkpoint_id``) and ``version`` ``'1.0.0'``.  torch draws
  ``save_id`` at random (a uuid4); here it is a uuid derived from the rest of the
  metadata, so the same state dict gives the same bytes.

Flattening follows torch's ``traverse_state_dict`` (§4): mappings are descended with
``str(key)`` path components; a list is descended (int components) only when it holds a
tensor, a mapping or such a list somewhere, else it is one value; tuples and everything
else are values; an empty mapping leaves no entry; FQN = the components joined with
``.``, and two paths with one FQN are refused, as torch refuses them.  Tensors are
ptfile tensors (a :class:`~ptfile.Parameter` records ``requires_grad=True`` in its
properties) and numpy arrays (torch would pickle an ndarray as a value); torch tensors
are converted first when torch is already imported, as :func:`ptfile.save` does.

The directory is written atomically: into a fresh sibling ``.DIR.*.tmp`` directory,
fsynced, then renamed to ``DIR``.  An existing ``DIR`` (a directory) is replaced only
after the new one is complete; on any error nothing is left behind and an existing
``DIR`` is untouched.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import IO, Any, Final

import numpy as np

from .. import config
from .._io.atomic import atomic_path
from ..errors import SaveError
from ..formats.zipped import write_zip
from ..model import dtypes
from ..model.tensor import Parameter, Storage, Tensor, contiguous_stride
from ..picklevm.pickler import Global, Reduce, dumps, global_

__all__ = ["DATA_FILE", "save_dcp"]

#: The one data file, as torch's default writer names rank 0's first (only) bucket.
DATA_FILE: Final = "__0_0.distcp"
METADATA_FILE: Final = ".metadata"
#: ``CURRENT_DCP_VERSION`` of torch 2.13.
DCP_VERSION: Final = "1.0.0"
#: CPython's default pickle protocol, which ``pickle.dump`` in torch's writer uses.
METADATA_PROTOCOL: Final = 4
#: Archive folder of every item (torch.save to a BytesIO).
ITEM_PREFIX: Final = "archive"
_NAMESPACE: Final = uuid.UUID("6c9a4c55-3f0e-4c2b-9d8e-2f1d0ad0c0de")

_MD: Final = "torch.distributed.checkpoint.metadata"
_METADATA: Final = global_(_MD, "Metadata")
_TENSOR_MD: Final = global_(_MD, "TensorStorageMetadata")
_BYTES_MD: Final = global_(_MD, "BytesStorageMetadata")
_CHUNK_MD: Final = global_(_MD, "ChunkStorageMetadata")
_PROPERTIES: Final = global_(_MD, "TensorProperties")
_MEM_FORMAT: Final = global_(_MD, "_MEM_FORMAT_ENCODING")
_INDEX: Final = global_(_MD, "MetadataIndex")
_STORAGE_META: Final = global_(_MD, "StorageMeta")
_STORAGE_INFO: Final = global_("torch.distributed.checkpoint.filesystem", "_StorageInfo")
_SIZE: Final = global_("torch", "Size")
_LAYOUT: Final = global_("torch.serialization", "_get_layout")
_POSIX_PATH: Final = global_("pathlib", "PosixPath")

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class _Item:
    """One planned write: its FQN, object path and value (a Tensor for tensor items)."""

    fqn: str
    path: Path
    value: Any
    requires_grad: bool = False


# --------------------------------------------------------------------------- planning

def _is_tensor(value: object) -> bool:
    return isinstance(value, (Tensor, np.ndarray))


def _is_terminal(value: object) -> bool:
    """torch's ``_is_terminal``: a value, or a list holding no tensor and no container."""
    if isinstance(value, Mapping):
        return False
    if not isinstance(value, list):
        return True
    return not any((isinstance(v, (Mapping, list)) and not _is_terminal(v)) or _is_tensor(v)
                   for v in value)


def _flatten(state_dict: Mapping[Any, Any]) -> list[_Item]:
    """The leaves of ``state_dict`` in torch's traversal order (module docstring)."""
    items: dict[str, _Item] = {}

    def visit(path: Path, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, child in value.items():
                visit((*path, str(key)), child)
        elif _is_terminal(value):
            fqn = ".".join(map(str, path))
            if fqn in items:
                raise SaveError(f"duplicated flatten key {fqn!r}: two paths join to one FQN")
            items[fqn] = _Item(fqn, path, value)
        else:
            for index, child in enumerate(value):
                visit((*path, index), child)

    for key, value in state_dict.items():
        visit((str(key),), value)
    return list(items.values())


# --------------------------------------------------------------------------- items

def _dense_permutation(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """True when ``stride`` lays ``shape`` out densely (some order of the dimensions)."""
    order = sorted(range(len(shape)), key=lambda d: stride[d])
    expected = 1
    for dim in order:
        if shape[dim] != 1 and stride[dim] != expected:
            return False
        expected *= shape[dim]
    return True


def _item_tensor(value: Tensor | np.ndarray) -> Tensor:
    """The tensor an item holds: ``value`` when its storage is exactly its elements, else a
    copy of them (a dense permutation keeps its strides, as torch's ``clone()`` does)."""
    tensor = _array_tensor(value) if isinstance(value, np.ndarray) else value
    if isinstance(tensor, Parameter):
        tensor = tensor.data
    storage, item = tensor.storage, tensor.dtype.itemsize
    if storage is None or storage.data is None:
        raise SaveError(f"{tensor!r} has no data (a meta tensor, or loaded with skip_data)")
    shape, stride = tuple(tensor.shape), tuple(tensor.stride())
    if tensor.storage_offset() != 0 or storage.nbytes != tensor.numel() * item:
        raw = tensor._raw_view(np.dtype(f"V{item}"))
        dense = _dense_permutation(shape, stride) and tensor.numel() > 0
        order = sorted(range(len(shape)), key=lambda d: -stride[d]) if dense else []
        copy = raw.transpose(order).copy(order="C") if order else raw.copy(order="C")
        laid = copy.transpose(np.argsort(order)) if order else copy
        stride = tuple(s // item for s in laid.strides) if copy.size else contiguous_stride(shape)
        storage = Storage(copy.reshape(-1).view(np.uint8).data, tensor.dtype,
                          untyped=tensor.dtype.is_v3, byteorder=storage.byteorder)
    return Tensor(storage, 0, shape, stride, dtype=tensor.dtype, metadata=tensor.metadata)


def _array_tensor(array: np.ndarray) -> Tensor:
    """A tensor over a dense, native-order copy of ``array`` (or ``array`` itself when it is
    one): numpy's order ``K`` keeps the layout of a dense permutation."""
    dtype = dtypes.from_numpy(array.dtype)
    dense = array.dtype.isnative and all(s > 0 for s in array.strides) and \
        _dense_permutation(array.shape, tuple(s // array.itemsize for s in array.strides))
    if not dense or array.size == 0:
        array = np.array(array, dtype=array.dtype.newbyteorder("="), order="K")
    flat = array.ravel(order="K")
    if not np.shares_memory(flat, array) and array.size:  # numpy's K copied: go C-order
        array = np.array(array, order="C")
        flat = array.reshape(-1)
    storage = Storage(flat.view(np.uint8).data, dtype, untyped=dtype.is_v3)
    stride = tuple(s // array.itemsize for s in array.strides) if array.size else \
        contiguous_stride(array.shape)
    return Tensor(storage, 0, array.shape, stride, dtype=dtype)


# --------------------------------------------------------------------------- metadata

def _size(dims: tuple[int, ...]) -> Reduce:
    return Reduce(_SIZE, ((*dims,),))


def _obj(cls: Global, state: object = None) -> Reduce:
    """A dataclass instance as the C pickler writes it: ``NEWOBJ(cls, ())`` + ``BUILD``."""
    return Reduce(cls, (), state, newobj=True)


def _tensor_md(tensor: Tensor, requires_grad: bool) -> Reduce:
    properties = _obj(_PROPERTIES, (
        global_("torch", tensor.dtype.name, "torch.dtype"), Reduce(_LAYOUT, ("torch.strided",)),
        requires_grad, Reduce(_MEM_FORMAT, (0,)), False))
    shape = tuple(tensor.shape)
    chunk = _obj(_CHUNK_MD, {"offsets": _size((0,) * len(shape)), "sizes": _size(shape)})
    return _obj(_TENSOR_MD, {"properties": properties, "size": _size(shape), "chunks": [chunk]})


def _storage_info(offset: int, length: int) -> Reduce:
    return _obj(_STORAGE_INFO, {"relative_path": DATA_FILE, "offset": offset, "length": length})


def _metadata(items: list[_Item], extents: dict[str, tuple[int, int]], directory: str,
              save_id: str) -> Reduce:
    """torch's ``Metadata`` of the written items, as pickler nodes."""
    state_dict_md: dict[str, Reduce] = {}
    storage_data: dict[Reduce, Reduce] = {}
    for item in items:
        if isinstance(item.value, Tensor):
            state_dict_md[item.fqn] = _tensor_md(item.value, item.requires_grad)
        else:
            state_dict_md[item.fqn] = _obj(_BYTES_MD)
    for item in sorted(items, key=lambda i: isinstance(i.value, Tensor)):  # bytes first
        if isinstance(item.value, Tensor):
            index = {"fqn": item.fqn, "index": 0,
                     "offset": _size((0,) * len(item.value.shape))}
        else:
            index = {"fqn": item.fqn, "index": None}
        storage_data[_obj(_INDEX, index)] = _storage_info(*extents[item.fqn])
    storage_meta = _obj(_STORAGE_META, {
        "checkpoint_id": Reduce(_POSIX_PATH, PurePath(directory).parts),
        "save_id": save_id, "load_id": None, "modules": []})
    return _obj(_METADATA, {"state_dict_metadata": state_dict_md,
                            "planner_data": {i.fqn: i.path for i in items},
                            "storage_data": storage_data, "storage_meta": storage_meta,
                            "version": DCP_VERSION})


def _metadata_bytes(items: list[_Item], extents: dict[str, tuple[int, int]],
                    directory: str) -> bytes:
    """The ``.metadata`` pickle, its ``save_id`` a uuid of everything else in it."""
    draft = dumps(_metadata(items, extents, directory, ""), METADATA_PROTOCOL)
    save_id = str(uuid.uuid5(_NAMESPACE, hashlib.sha256(draft).hexdigest()))
    return dumps(_metadata(items, extents, directory, save_id), METADATA_PROTOCOL)


# --------------------------------------------------------------------------- writing

def _write_items(items: list[_Item], fp: IO[bytes]) -> dict[str, tuple[int, int]]:
    """Write every item to ``fp`` (values first); return each FQN's ``(offset, length)``."""
    settings = config.current()
    extents: dict[str, tuple[int, int]] = {}
    write: Callable[[Any], Any] = fp.write
    for item in sorted(items, key=lambda i: isinstance(i.value, Tensor)):
        start = fp.tell()
        try:
            write_zip(item.value, write, ITEM_PREFIX, settings, byteorder=sys.byteorder)
        except SaveError as exc:
            raise SaveError(f"DCP item {item.fqn!r}: {exc}") from exc
        extents[item.fqn] = (start, fp.tell() - start)
    return extents


def _planned(state_dict: Mapping[Any, Any]) -> list[_Item]:
    items = []
    for item in _flatten(state_dict):
        if _is_tensor(item.value):
            grad = isinstance(item.value, Tensor) and item.value.requires_grad
            items.append(_Item(item.fqn, item.path, _item_tensor(item.value), grad))
        else:
            items.append(item)
    return items


@contextlib.contextmanager
def _atomic_directory(target: str) -> Iterator[str]:
    """A fresh directory (``os.mkdir``'s modes) renamed to ``target`` once the block
    succeeds (:func:`ptfile._io.atomic.atomic_path`: an existing directory is replaced then)."""
    if os.path.exists(target) and not os.path.isdir(target):
        raise SaveError(f"{target!r} exists and is not a directory")
    with atomic_path(target, fsync=True, same_name=True) as tmp:
        os.mkdir(tmp)
        yield tmp


def save_dcp(state_dict: Mapping[Any, Any], directory: str | os.PathLike[str]) -> None:
    """Write ``state_dict`` as a ``torch.distributed.checkpoint`` directory, without torch.

    The directory is what ``dcp.save(state_dict, checkpoint_id=directory)`` writes from
    a single process (``__0_0.distcp`` and ``.metadata``; the layout is in
    :mod:`ptfile.dcp.writer`): ``torch.distributed.checkpoint.load`` reads it back into
    a state dict of the same structure, ``dcp_to_torch_save`` consolidates it, and
    :func:`ptfile.load_dcp` reads it too.

    Parameters
    ----------
    state_dict
        A mapping of nested dicts and lists whose leaves are ptfile tensors, numpy
        arrays (both saved as tensors) and any value :func:`ptfile.save` writes (saved
        as pickled values).  torch tensors are converted when torch is imported.
    directory
        The checkpoint directory.  It is written atomically; an existing directory there
        is replaced only once the new checkpoint is complete.

    Raises
    ------
    SaveError
        A value ptfile cannot write, two paths that join to one FQN, or a ``directory``
        that exists and is not a directory.

    Examples
    --------
    >>> import numpy as np, os, ptfile, tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = os.path.join(tmp.name, "ckpt")
    >>> ptfile.save_dcp({"model": {"w": np.ones((2, 3), "float32")}, "step": 7}, out)
    >>> sorted(os.listdir(out))
    ['.metadata', '__0_0.distcp']
    >>> ptfile.load_dcp(out)["model"]["w"].shape
    torch.Size([2, 3])
    >>> tmp.cleanup()
    """
    if not isinstance(state_dict, Mapping):
        raise SaveError(f"a DCP state dict is a mapping, not {type(state_dict).__name__}")
    if sys.modules.get("torch") is not None:
        from ..model.torch import from_torch  # the bridge imports torch: only here

        state_dict = from_torch(state_dict)
    items = _planned(state_dict)
    target = os.fspath(directory)
    with _atomic_directory(target) as tmp:
        with open(os.path.join(tmp, DATA_FILE), "wb") as fp:
            extents = _write_items(items, fp)
            fp.flush()
            os.fsync(fp.fileno())
        with open(os.path.join(tmp, METADATA_FILE), "wb") as fp:
            fp.write(_metadata_bytes(items, extents, target))
            fp.flush()
            os.fsync(fp.fileno())
