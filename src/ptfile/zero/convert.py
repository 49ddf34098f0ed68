"""Consolidate a ZeRO checkpoint into one ``.pt``, one ``.safetensors`` or an HF folder, streaming.

``ptfile convert ZERO_DIR out.pt | out.safetensors | hf-dir/`` writes what DeepSpeed's
``zero_to_fp32.py`` (``convert_zero_checkpoint_to_state_dict``) writes, tensor by tensor:
each tensor is assembled from its rank pieces (:class:`~.reader.Assembler`), cast to the
output dtype (float32 by default, as the script; ``dtype`` as ``zero_to_torch.py
--dtype``; integer and bool buffers keep theirs), written and freed, so the memory held is
the largest tensor plus the files' pickles.  The writers are the DCP consolidation's
(:mod:`ptfile.dcp.consolidate`):

* ``.pt``: the state dict pickled first (every tensor a storage without data, tied names
  the same tensor as their target: one storage), then each ``data/<key>`` record filled in
  turn (:func:`ptfile.formats.zipped.write_zip`'s ``fill``), in pieces of at most 16 MiB.
  The storages are those ``zero_to_fp32.py`` writes (a ZeRO-1/2 parameter is a view of its
  whole flat group, a ZeRO-3 one keeps its partition padding, a buffer its storage of the
  model file), so with the default float32 output the file is byte-identical to its
  ``pytorch_model.bin``; a cast tensor gets a storage of its own, as there too.
* ``.safetensors`` and a folder (Hugging Face's shards and index): every tensor by name.
  DeepSpeed's script cannot write tied weights there (safetensors refuses shared memory);
  ptfile writes them as ``shared`` says, as ``ptfile convert`` does for any file
  (``dedupe``: once, the alias listed under ``ptfile.aliases`` in the metadata; ``copy``:
  each name; ``error``: refused).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any

import numpy as np

from .. import config
from .._io.atomic import atomic_file
from ..dcp.consolidate import SHARD_BYTES, write_hf, write_safetensors
from ..errors import SaveError, UnsupportedFeatureError
from ..formats.inputs import Input
from ..formats.safetensors.writer import Planned
from ..formats.zipped import archive_prefix, write_zip
from ..limits import Limits
from ..model.dtypes import DType
from ..model.tensor import Storage, Tensor, contiguous_stride
from . import open_zero
from .reader import ZeroReader

__all__ = ["convert_zero"]


def _write_pt(ck: ZeroReader, dst: str) -> int:
    """The consolidated ``.pt`` in ``zero_to_fp32``'s storage layout (:class:`~.layout.Entry`'s
    ``storage``) where a tensor keeps the files' dtype; return the number of tensors."""
    root: dict[str, Any] = {}
    shared: dict[str, Storage] = {}
    fills: dict[int, Callable[[], Iterator[memoryview]]] = {}
    for name, entry in ck.layout.entries.items():
        dtype = ck.dtype_of(entry)
        offset = 0
        if entry.storage and dtype == entry.source:
            storage = shared.get(entry.storage_key) if entry.storage_key else None
            if storage is None:
                numel = sum(p.count for p in entry.storage)
                storage = Storage(None, dtype, nbytes=numel * dtype.itemsize)
                fills[id(storage)] = partial(ck.assembler.chunks, entry.storage)
                if entry.storage_key:
                    shared[entry.storage_key] = storage
            offset = entry.storage_offset
        else:  # its own storage: the values, cast
            storage = Storage(None, dtype, nbytes=entry.numel * dtype.itemsize)
            fills[id(storage)] = partial(_values, ck, name)
        root[name] = Tensor(storage, offset, entry.shape, contiguous_stride(entry.shape),
                            dtype=dtype, requires_grad=entry.requires_grad)
    for alias, target in ck.layout.aliases.items():
        root[alias] = root[target]

    def fill(storage: Storage) -> Iterator[memoryview]:
        return fills[id(storage)]()

    with atomic_file(dst, fsync=False) as fp:
        write_zip(root, fp.write, archive_prefix(dst), config.current(),
                  byteorder=sys.byteorder, fill=fill)
    return len(root)


def _values(ck: ZeroReader, name: str) -> Iterator[memoryview]:
    yield np.ascontiguousarray(ck.get_tensor(name)).reshape(-1).view(np.uint8).data


def _planned(ck: ZeroReader, shared: str) -> tuple[list[Planned], dict[str, str]]:
    """The tensors a safetensors output holds, and the aliases it leaves out."""
    aliases = dict(ck.layout.aliases)
    if aliases and shared == "error":
        alias, target = next(iter(aliases.items()))
        raise SaveError(f"{alias!r} and {target!r} share one tensor (tied weights): use "
                        "shared='dedupe' or 'copy'")
    names = ck.layout.names() if shared == "copy" else list(ck.layout.entries)
    planned = []
    for name in names:
        entry = ck.layout.entry(name)
        planned.append(Planned(name, ck.dtype_of(entry), entry.shape))
    return planned, ({} if shared == "copy" else aliases)


def convert_zero(src: str | os.PathLike[str] | Input, dst: str | os.PathLike[str], *,
                 to: str, tag: str | None = None, exclude_frozen: bool = False,
                 dtype: str | DType | None = "float32", shard_bytes: int = SHARD_BYTES,
                 shared: str = "dedupe", limits: Limits | None = None,
                 storage_options: Mapping[str, Any] | None = None,
                 frozen_from_module: bool = False) -> dict[str, Any]:
    """Consolidate the ZeRO checkpoint ``src`` into ``dst``, one tensor at a time.

    Parameters
    ----------
    src
        The run folder (``latest`` names the tag) or a tag folder; a path or a URL.
    dst
        ``*.pt`` (``.bin``...), ``*.safetensors``, or a folder (Hugging Face's shards).
    to
        ``"pt"``, ``"safetensors"`` or ``"hf"``.
    tag, exclude_frozen, frozen_from_module
        As :func:`ptfile.zero.load_zero`.
    dtype
        The floating tensors' output dtype: ``"fp32"`` (default, as ``zero_to_fp32.py``),
        ``"fp16"``, ``"bf16"``, or None to keep each tensor's (frozen parameters stay in
        the model's dtype, as ``get_fp32_state_dict_from_zero_checkpoint`` returns them).
    shard_bytes
        The largest shard of a folder output.
    shared
        Tied names in a safetensors output (module docstring).

    Returns
    -------
    dict
        A summary: output, kind, tensors, shards, aliases (tied names left out of a
        safetensors output), dropped, changed.

    Raises
    ------
    FormatError, UnsupportedFeatureError, UnsafeGlobalError
        As :func:`ptfile.zero.load_zero`.
    SaveError
        ``shared="error"`` and the model has tied weights.

    Examples
    --------
    >>> convert_zero("no-such-folder", "out.pt", to="pt")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ptfile.errors.FormatError: 'no-such-folder' is not a folder
    """
    target = os.fspath(dst)
    with open_zero(src, tag=tag, exclude_frozen=exclude_frozen, dtype=dtype, limits=limits,
                   storage_options=storage_options, frozen_from_module=frozen_from_module) as ck:
        aliases: dict[str, str] = {}
        shards = 0
        if to == "pt":
            out, count = target, _write_pt(ck, target)
            return {"output": out, "kind": to, "tensors": count, "shards": 0, "aliases": {},
                    "dropped": [], "changed": []}
        if to not in ("safetensors", "hf"):
            raise UnsupportedFeatureError(f"a ZeRO checkpoint converts to .pt, .safetensors or "
                                          f"a folder, not {to!r}")
        planned, aliases = _planned(ck, shared)
        if to == "safetensors":
            out = target
            count = len(write_safetensors(target, planned, ck.get_tensor, aliases).order)
        else:
            out, count, shards = write_hf(target, planned, ck.get_tensor, aliases, shard_bytes)
    return {"output": out, "kind": to, "tensors": count, "shards": shards,
            "aliases": aliases, "dropped": [], "changed": []}
