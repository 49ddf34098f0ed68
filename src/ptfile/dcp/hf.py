"""The :class:`~ptfile.formats.dcp_metadata.Metadata` of a HuggingFaceStorageWriter directory.

``torch.distributed.checkpoint.HuggingFaceStorageWriter`` writes no ``.metadata``
(``../shared/spec/dcp-format.md`` §10): the directory's own ``*.safetensors`` files
(``model-00001-of-00002.safetensors``…, or one ``shard-00001-model-…`` per rank with
``save_distributed=True``; with consolidation, the full tensors at the top level and the
shards in ``sharded/``, which is not read), each one safetensors blob from byte 0, and
perhaps ``model.safetensors.index.json``.  As torch's ``HuggingFaceStorageReader`` does,
ptfile reads every top-level ``*.safetensors`` header, in name order:

* each entry is a chunk of the tensor its key names, at the ``saved_offsets`` of the
  ``DCP_SHARDING_INFO`` JSON in the header's ``__metadata__`` (zeros without one);
* a tensor's size is, per dimension, the largest chunk end; its dtype is the entry's;
* the chunk's storage entry is ``(file, 0, nbytes)``, so it is read as a SAFETENSORS-format
  chunk (:func:`ptfile.dcp.load.read_region`), its entry checked again against the chunk.

There is no ``planner_data``: the state dict is flat, keyed by FQN.
"""

from __future__ import annotations

import math
from typing import Any, Final

from .._io.directory import DirectoryFiles
from ..errors import FormatError
from ..formats.dcp_metadata import (
    ChunkStorageMetadata,
    ItemKey,
    Metadata,
    StorageInfo,
    TensorStorageMetadata,
    size,
)
from ..formats.safetensors import CODES, header_json, saved_offsets
from ..formats.safetensors.meta import aliases_of
from ..limits import DEFAULT_LIMITS, Limits
from ..model.dtypes import by_name

__all__ = ["hf_aliases", "hf_metadata"]

SUFFIX: Final = ".safetensors"


def _header(files: DirectoryFiles, name: str, limits: Limits) -> dict[str, Any]:
    """The header's JSON object, read once per folder by the one bounded safetensors
    header reader."""
    key = ("safetensors header", name)
    found: dict[str, Any] | None = files.memo.get(key)
    if found is None:
        what = f"the safetensors header of {name!r}"
        found = files.memo[key] = header_json(lambda at, n: files.read(name, at, n, what),
                                              files.size(name, what), limits, what)[0]
    return found


def hf_aliases(files: DirectoryFiles, limits: Limits = DEFAULT_LIMITS) -> dict[str, str]:
    """The tied names ptfile's safetensors writer left out of the folder's files
    (each file's ``ptfile.aliases``, :mod:`ptfile.formats.safetensors.meta`): ``{alias:
    kept}``, each ``kept`` a tensor of the folder, read from the headers
    :func:`hf_metadata` read."""
    names = [n for n in files.names() if n.endswith(SUFFIX)]
    headers = {name: _header(files, name, limits) for name in names}
    stored = {fqn for header in headers.values() for fqn in header if fqn != "__metadata__"}
    out: dict[str, str] = {}
    for header in headers.values():
        meta = header.get("__metadata__")
        out.update(aliases_of(meta if isinstance(meta, dict) else None, stored))
    return out


def _entry(fqn: str, entry: Any, saved: list[int], name: str
           ) -> tuple[str, ChunkStorageMetadata]:
    """The dtype name and chunk of one header entry, saved at ``saved``."""
    try:
        shape = size(tuple(entry["shape"]))
        dtype = CODES[entry["dtype"]]
        offsets = size(tuple(saved))
    except (KeyError, TypeError, FormatError) as exc:
        raise FormatError(f"the safetensors entry {fqn!r} of {name!r} is damaged: "
                          f"{exc!s:.120}") from exc
    if len(offsets) != len(shape):
        raise FormatError(f"the saved offsets of {fqn!r} in {name!r} do not match its shape")
    return dtype, ChunkStorageMetadata(offsets, shape)


def hf_metadata(files: DirectoryFiles, limits: Limits = DEFAULT_LIMITS) -> Metadata:
    """The checkpoint's metadata, from its ``*.safetensors`` headers only.

    Raises
    ------
    FormatError
        A header is damaged, or files disagree on a tensor's dtype.
    """
    dtypes: dict[str, str] = {}
    chunks: dict[str, list[ChunkStorageMetadata]] = {}
    storage: dict[ItemKey, StorageInfo] = {}
    for name in (n for n in files.names() if n.endswith(SUFFIX)):
        header = _header(files, name, limits)
        saved = saved_offsets(header, repr(name))
        for fqn, entry in header.items():
            if fqn == "__metadata__":
                continue
            dtype, chunk = _entry(fqn, entry, saved[fqn], name)
            if dtypes.setdefault(fqn, dtype) != dtype:
                raise FormatError(f"the files disagree on the dtype of {fqn!r}")
            if (fqn, chunk.offsets) in storage:
                raise FormatError(f"the chunk of {fqn!r} at {chunk.offsets} is in two files")
            known = chunks.setdefault(fqn, [])
            if known and len(known[0].sizes) != len(chunk.sizes):
                raise FormatError(f"the files disagree on the dimensions of {fqn!r}")
            known.append(chunk)
            nbytes = math.prod(chunk.sizes) * by_name(dtype).itemsize
            storage[(fqn, chunk.offsets)] = StorageInfo(name, 0, nbytes)
    items = {fqn: TensorStorageMetadata(by_name(dtypes[fqn]), _size(found), tuple(found))
             for fqn, found in chunks.items()}
    return Metadata(dict(items), None, storage)


def _size(chunks: list[ChunkStorageMetadata]) -> tuple[int, ...]:
    """Per dimension, the largest chunk end (as torch's reader sizes the tensor)."""
    return tuple(max(o + s for o, s in dims)
                 for dims in zip(*(zip(c.offsets, c.sizes, strict=True) for c in chunks),
                                 strict=True))
