"""``ptfile convert``: pick the conversion from the file names, one file or one shard at a time."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from .. import api
from ..errors import UnsupportedFeatureError
from ..reader import flatten
from ..reader import open as open_checkpoint
from ..tensor import Tensor
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
    if source.endswith(".safetensors.index.json"):
        return "pt"
    if source.endswith(".index.json"):
        return "safetensors"
    kind = SUFFIXES.get(os.path.splitext(output)[1].lower())
    if kind is None:
        raise UnsupportedFeatureError(f"cannot tell what to write from {output!r}; "
                                      "use --to safetensors|npz|pt")
    return kind


def _from_safetensors(src: str) -> dict[str, Tensor]:
    tensors, meta = load_safetensors(src)
    aliases = json.loads(meta.get("ptfile.aliases", "{}"))
    for alias, kept in aliases.items():  # tied names come back sharing one tensor
        if isinstance(alias, str) and kept in tensors:
            tensors[alias] = tensors[kept]
    return tensors


def convert_file(src: str, dst: str, to: str, shared: SharedPolicy = "dedupe",
                 counted: list[int] | None = None) -> dict[str, str]:
    """Convert one file; return the aliases dropped (safetensors output only).

    The number of tensors converted is appended to ``counted`` when given.

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, SaveError
        From reading ``src`` or writing ``dst``.
    """
    if src.endswith(".safetensors"):
        tensors = _from_safetensors(src)
    elif to == "pt":
        obj = api.load(src, mmap=True)
        api.save(obj, dst)
        if counted is not None:
            counted.append(len(flatten(obj)))
        return {}
    else:
        with open_checkpoint(src) as ck:
            tensors = ck.load_tensors()
    writers: dict[str, Callable[[], Any]] = {
        "safetensors": lambda: dump(tensors, dst, shared=shared),
        "npz": lambda: dump_npz(tensors, dst),
        "pt": lambda: api.save(tensors, dst),
    }
    if counted is not None:
        counted.append(len(tensors))
    return writers[to]() or {}


def convert(src: str, dst: str, *, to: str, shared: SharedPolicy = "dedupe",
            on_step: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Convert ``src`` to ``dst`` as ``to``; a ``*.index.json`` source converts every shard.

    Returns
    -------
    dict
        A summary: output, kind, tensors, shards, aliases.

    Raises
    ------
    FormatError, UnsafeGlobalError, UnsupportedFeatureError, SaveError
        From reading or writing.
    """
    if src.endswith(".index.json"):
        index = convert_sharded(src, dst, shared=shared,
                                convert_shard=lambda a, b, kind: convert_file(a, b, kind, shared),
                                on_shard=lambda _: on_step(1) if on_step else None)
        with open(index, encoding="utf-8") as fp:
            weight_map = json.load(fp)["weight_map"]
        return {"output": index, "kind": f"sharded {to}", "tensors": len(weight_map),
                "shards": len(set(weight_map.values())), "aliases": {}}
    counted: list[int] = []
    aliases = convert_file(src, dst, to, shared, counted)
    if on_step is not None:
        on_step(1)
    return {"output": dst, "kind": to, "tensors": sum(counted), "shards": 0, "aliases": aliases}
