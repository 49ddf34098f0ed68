"""``ptfile convert``: pick the conversion from the file names, one file or one shard at a time
(a DCP directory: one tensor at a time, :mod:`ptfile.export.dcp`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from .. import api
from .._dcp_files import is_directory
from .._io import is_path, is_url
from .._remote import StorageOptions, open_any, open_target
from ..errors import UnsupportedFeatureError
from ..reader import open as open_checkpoint
from ..tensor import Tensor
from ..tree import flatten
from .dcp import convert_dcp
from .npz import dump_npz
from .safetensors import SharedPolicy, convert_sharded, dump, load_safetensors

__all__ = ["convert", "target_kind"]

#: Output suffix → output kind.
SUFFIXES = {".safetensors": "safetensors", ".npz": "npz", ".pt": "pt", ".pth": "pt",
            ".bin": "pt", ".ckpt": "pt"}


def target_kind(output: str, source: str) -> str:
    """The kind to write, from the output's suffix (or the index being converted).

    Raises
    ------
    UnsupportedFeatureError
        Neither name says what to write.

    Examples
    --------
    >>> target_kind("model.safetensors", "model.pt")
    'safetensors'
    >>> target_kind("out/", "pytorch_model.bin.index.json")
    'safetensors'
    """
    if is_directory(source):  # a DCP checkpoint: .pt, .safetensors or an HF folder
        return _dcp_kind(output)
    if source.endswith(".safetensors.index.json"):
        return "pt"
    if source.endswith(".index.json"):
        return "safetensors"
    kind = SUFFIXES.get(os.path.splitext(output)[1].lower())
    if kind is None:
        raise UnsupportedFeatureError(f"cannot tell what to write from {output!r}; "
                                      "use --to safetensors|npz|pt")
    return kind


def _dcp_kind(dst: str) -> str:
    """``pt``, ``safetensors`` or ``hf`` (a folder: a trailing separator, an existing
    directory, or no suffix)."""
    if dst.endswith(("/", os.sep)) or os.path.isdir(dst) or not os.path.splitext(dst)[1]:
        return "hf"
    kind = SUFFIXES.get(os.path.splitext(dst)[1].lower())
    if kind not in ("pt", "safetensors"):
        raise UnsupportedFeatureError(f"a DCP checkpoint converts to .pt, .safetensors or a "
                                      f"folder, not {dst!r}")
    return kind


def _from_safetensors(src: str) -> dict[str, Tensor]:
    tensors, meta = load_safetensors(src)
    aliases = json.loads(meta.get("ptfile.aliases", "{}"))
    for alias, kept in aliases.items():  # tied names come back sharing one tensor
        if isinstance(alias, str) and kept in tensors:
            tensors[alias] = tensors[kept]
    return tensors


def convert_file(src: str, dst: str, to: str, shared: SharedPolicy = "dedupe",
                 counted: list[int] | None = None, storage_options: StorageOptions = None,
                 structural: bool = False) -> dict[str, str]:
    """Convert one file; return the aliases dropped (safetensors output only).

    ``src`` and ``dst`` may be URLs (``storage_options`` for both): a URL source
    is fetched with range requests, a URL target is written through its fsspec
    backend (a ``.safetensors``/``.npz`` one is written locally first, then
    uploaded; nothing partial is left on failure).  The number of tensors
    converted is appended to ``counted`` when given.  ``structural`` reads a pickle
    that names globals outside the weights-only allowlist (a whole pickled
    module: its state dict is converted) with inert stand-ins.

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, SaveError
        From reading ``src`` or writing ``dst``.
    RemoteError
        A URL could not be read or written.
    """
    if src.endswith(".safetensors"):
        with _local(src, storage_options) as path:
            tensors = _from_safetensors(path)
    elif to == "pt" and not structural:
        obj = api.load(src, mmap=is_path(src), storage_options=storage_options)
        api.save(obj, dst, storage_options=storage_options)
        if counted is not None:
            counted.append(len(flatten(obj)))
        return {}
    else:
        with open_checkpoint(src, storage_options=storage_options, structural=structural) as ck:
            tensors = ck.load_tensors()
    if counted is not None:
        counted.append(len(tensors))
    if to == "pt":
        api.save(tensors, dst, storage_options=storage_options)
        return {}
    with _staged(dst, storage_options) as path:
        if to == "npz":
            dump_npz(tensors, path)
            return {}
        return dump(tensors, path, shared=shared) or {}


@contextlib.contextmanager
def _local(src: str, storage_options: StorageOptions) -> Iterator[str]:
    """A local path holding ``src``: itself, or a temporary download of a URL."""
    if not is_url(src):
        yield src
        return
    source = open_any(src, storage_options=storage_options)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, os.path.basename(src.split("?")[0]) or "input")
        with open(path, "wb") as fp:
            fp.write(source.view(0, source.size, "the file"))
        yield path


@contextlib.contextmanager
def _staged(dst: str, storage_options: StorageOptions) -> Iterator[str]:
    """A local path to write ``dst`` to: itself, or a temporary file uploaded to the URL
    once written."""
    if not is_url(dst):
        yield dst
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, os.path.basename(dst.split("?")[0]) or "output")
        yield path
        with open(path, "rb") as local, open_target(dst, storage_options) as remote:
            shutil.copyfileobj(local, remote, _UPLOAD_CHUNK_BYTES)


#: What one write to an upload target takes at a time.
_UPLOAD_CHUNK_BYTES = 8 << 20


def convert(src: str, dst: str, *, to: str, shared: SharedPolicy = "dedupe",
            on_step: Callable[[int], None] | None = None,
            storage_options: StorageOptions = None, structural: bool = False) -> dict[str, Any]:
    """Convert ``src`` to ``dst`` as ``to``; a ``*.index.json`` source converts every shard.

    Returns
    -------
    dict
        A summary: output, kind, tensors, shards, aliases.

    A DCP directory converts tensor by tensor (:mod:`ptfile.export.dcp`) to ``to``
    ``"pt"``, ``"safetensors"`` or ``"hf"`` (a sharded folder).

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, SaveError
        From reading or writing.
    """
    if is_directory(src, storage_options):
        summary = convert_dcp(src, dst, to=to, storage_options=storage_options)
        if on_step is not None:
            on_step(1)
        return summary
    if src.endswith(".index.json"):
        if is_url(src) or is_url(dst):
            raise UnsupportedFeatureError("sharded checkpoints convert between local folders; "
                                          "convert each shard's URL on its own")
        index = convert_sharded(src, dst, shared=shared,
                                convert_shard=lambda a, b, kind: convert_file(a, b, kind, shared),
                                on_shard=lambda _: on_step(1) if on_step else None)
        with open(index, encoding="utf-8") as fp:
            weight_map = json.load(fp)["weight_map"]
        return {"output": index, "kind": f"sharded {to}", "tensors": len(weight_map),
                "shards": len(set(weight_map.values())), "aliases": {}}
    counted: list[int] = []
    aliases = convert_file(src, dst, to, shared, counted, storage_options, structural)
    if on_step is not None:
        on_step(1)
    return {"output": dst, "kind": to, "tensors": sum(counted), "shards": 0, "aliases": aliases}
